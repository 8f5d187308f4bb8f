"""Do two run directories hold the same run? History (every field but timing),
checkpoint, hall of fame and champion (tree and metrics) are compared.

Used to check that a change to the engine changes no result: run the same
command (same seed and options) before and after the change into two runs
directories, then

    python -m benchmarks.checks.compare_runs RUN_DIR_A RUN_DIR_B

Prints one line per file and exits 1 if anything differs.
"""

import json
import sys
from pathlib import Path


def _history(run: Path) -> list:
    out = []
    for line in (run / "history.jsonl").read_text().splitlines():
        if line.strip():
            rec = json.loads(line)
            rec.pop("timing", None)
            out.append(rec)
    return out


def _champion(run: Path) -> dict:
    ch = json.loads((run / "champion.json").read_text())
    strip = {k: {m: v for m, v in d.items() if m != "eval_ms"} for k, d in ch["metrics"].items()}
    return {"tree": ch["tree"], "metrics": strip}


def compare(a: Path, b: Path) -> bool:
    checks = {
        "history.jsonl (without timing)": (_history(a), _history(b)),
        "checkpoint.json": tuple(json.loads((r / "checkpoint.json").read_text()) for r in (a, b)),
        "hall_of_fame.json": tuple(json.loads((r / "hall_of_fame.json").read_text())
                                   for r in (a, b)),
        "champion.json (tree and metrics)": (_champion(a), _champion(b)),
    }
    same = True
    for name, (x, y) in checks.items():
        ok = x == y
        same &= ok
        print(f"{'same' if ok else 'DIFFERENT'}: {name}")
    return same


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(0 if compare(Path(sys.argv[1]), Path(sys.argv[2])) else 1)
