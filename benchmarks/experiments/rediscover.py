"""Does evolution rediscover the optimum of the seed metric from random trees?

Runs `--objective seed` from random initialisation (no baseline seeding) for
several seeds on the default data and prints each champion's valid fitness
beside standard rejection's. Usage:

    python -m benchmarks.experiments.rediscover [--generations 200] [--population 500] [--seeds 1 2 3 4 5]
"""

import argparse
import json
import time


from evolve.data import tokens as data  # noqa: E402
from evolve.lang import codegen, treeio  # noqa: E402
from evolve.objectives.metrics import fitness  # noqa: E402
from evolve.io.paths import DATA_DIR  # noqa: E402
from evolve.search.config import Config  # noqa: E402
from evolve.search.engine import Evolution  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--generations", type=int, default=200)
    ap.add_argument("--population", type=int, default=500)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    ap.add_argument("--objective", choices=("seed", "expected"), default="seed")
    args = ap.parse_args()
    splits = data.load_splits(DATA_DIR)
    valid = splits["valid"]
    std = fitness(len(valid), int(valid.baseline_accepts.sum()), 0, 0)
    rows = []
    for seed in args.seeds:
        cfg = Config(generations=args.generations, population=args.population, seed=seed,
                     objective=args.objective)
        t0 = time.perf_counter()
        ev = Evolution(cfg, splits["train"], valid)
        ev.initialise()
        first_hit = None
        while ev.generation < cfg.generations:
            rec = ev.step()
            if first_hit is None and rec["best_valid"] >= std - 0.005:
                first_hit = rec["generation"]
        champ = ev.champion()
        vf = float(ev.valid_scores([champ.tree])[0])
        rows.append({"seed": seed, "valid_fitness": vf, "standard_rejection": std,
                     "gap": std - vf, "within_0.005": vf >= std - 0.005,
                     "first_generation_within": first_hit,
                     "champion": codegen.infix(treeio.parse(champ.tree)),
                     "seconds": time.perf_counter() - t0})
        print(json.dumps(rows[-1]), flush=True)
    ok = sum(r["within_0.005"] for r in rows)
    print(f"{ok}/{len(rows)} seeds within 0.005 of standard rejection "
          f"(valid fitness {std:.4f})")


if __name__ == "__main__":
    main()
