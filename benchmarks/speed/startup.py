"""What a short `evolve run` costs besides its generations, cold and warm.

For a token run (default splits) and a trace run (``--objective speed``), each
in a fresh process:

cold   seconds from starting ``evolve run`` to its progress line for generation 0
       with an empty Numba cache (a temporary NUMBA_CACHE_DIR: every kernel the
       command needs is compiled), and to its exit;
warm   a 1-generation run with the cache warm: wall seconds, the seconds its
       generations took (history.jsonl timing) and the difference (start-up,
       data, champion metrics, final table and files).

    python -m benchmarks.speed.startup [--population N] [--traces DIR] [--out FILE]

Prints a table and writes the figures as JSON (default
benchmarks/speed/startup-results.json).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import ROOT
FIRST_GENERATION = "gen 0/"


def _env(extra: dict | None = None) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([env["PYTHONPATH"]]
                                                       if env.get("PYTHONPATH") else []))
    env.setdefault("NO_COLOR", "1")
    env.update(extra or {})
    return env


def _cmd(runs: Path, population: int, extra: list[str]) -> list[str]:
    return [sys.executable, "-m", "evolve", "run", "--generations", "1", "--population",
            str(population), "--seed", "2", "--no-writeback", "--runs-dir", str(runs), *extra]


def cold(population: int, extra: list[str]) -> dict:
    """Seconds to generation 0 and to exit, from an empty Numba cache."""
    with tempfile.TemporaryDirectory() as tmp:
        env = _env({"NUMBA_CACHE_DIR": str(Path(tmp) / "cache")})
        t0 = time.perf_counter()
        proc = subprocess.Popen(_cmd(Path(tmp) / "runs", population, extra), cwd=ROOT, env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        first = None
        for line in proc.stderr:
            if first is None and line.startswith(FIRST_GENERATION):
                first = time.perf_counter() - t0
        rc = proc.wait()
        end = time.perf_counter() - t0
    if rc != 0 or first is None:
        raise SystemExit(f"startup: evolve run {' '.join(extra)} failed (exit {rc})")
    return {"to_generation_0_s": first, "to_exit_s": end}


def warm(population: int, extra: list[str]) -> dict:
    """Wall seconds of a 1-generation run, its generations' seconds and the rest."""
    with tempfile.TemporaryDirectory() as tmp:
        runs = Path(tmp) / "runs"
        t0 = time.perf_counter()
        subprocess.run(_cmd(runs, population, extra), cwd=ROOT, env=_env(), check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wall = time.perf_counter() - t0
        hist = next(runs.glob("*/history.jsonl")).read_text().splitlines()
        gens = sum(json.loads(h)["timing"]["seconds"] for h in hist if h.strip())
    return {"wall_s": wall, "generations_s": gens, "beyond_generations_s": wall - gens}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--population", type=int, default=100)
    ap.add_argument("--traces", default=str(ROOT / "datasets" / "traces"))
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "speed" / "startup-results.json"))
    a = ap.parse_args(argv)
    kinds = {"tokens": [],
             "traces": ["--objective", "speed", "--budget-tv", "0.03", "--data", a.traces]}
    result = {"population": a.population, "load_average": os.getloadavg(),
              "cpus": os.cpu_count()}
    for name, extra in kinds.items():
        result[name] = {"cold": cold(a.population, extra), "warm": warm(a.population, extra)}
    rows = []
    for name in kinds:
        c, w = result[name]["cold"], result[name]["warm"]
        rows.append(f"{name:7s} cold: generation 0 at {c['to_generation_0_s']:5.1f} s, exit at "
                    f"{c['to_exit_s']:5.1f} s | warm 1-generation run: {w['wall_s']:.2f} s, "
                    f"generations {w['generations_s']:.2f} s, beyond {w['beyond_generations_s']:.2f} s")
    print(f"evolve run --generations 1 --population {a.population} (load average "
          f"{result['load_average'][0]:.2f} on {result['cpus']} cpus)")
    print("\n".join(rows))
    from evolve.io.atomic import atomic_write_json
    atomic_write_json(a.out, result)
    print(f"written: {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
