"""How long the README's tour takes: each of its commands, timed in an empty directory.

    python -m benchmarks.speed.tour_time [--section HEADING] [--again] [--keep DIR] [--json FILE]

Reads the commands of the README's tour (the ``sh`` block under its ``## A tour``
heading, or under ``--section``'s, e.g. "Tasks with checked answers") and runs them one after the other in a new empty directory, as a user who
has run ``pip install .`` would: ``evolve`` is this checkout's package copied outside
it (``evolve/`` and ``heuristics/``, no compiled caches), so the data, runs and
champions go into that directory, and Numba's cache starts empty (every kernel is
compiled on the way, as on a fresh install). ``--again`` then runs the tour a second
time in another empty directory with the cache the first run left (what every later
tour costs). Prints each step's wall time, the totals and the machine (CPU model,
cores, memory, load average before the first step). Each command's output is kept as
``step-N.out`` in the tour's directory (``--keep DIR``: DIR/first and DIR/again; else
a temporary directory, removed). Exits 1 if a step fails.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import ROOT

TOUR_HEADING = "A tour"


def readme_block(heading: str, lang: str, readme: Path = ROOT / "README.md") -> str:
    """The first ```lang block under the README's ``## heading`` (the heading's text up to
    its first parenthesis or colon, so a measured time in it does not change the name)."""
    text = readme.read_text()
    for m in re.finditer(r"^## (.+)$", text, re.M):
        title = re.split(r"[(:]", m.group(1), maxsplit=1)[0].strip()
        if title == heading:
            section = text[m.end():].split("\n## ", 1)[0]
            block = re.search(rf"```{lang}\n(.*?)```", section, re.S)
            if block:
                return block.group(1)
    raise SystemExit(f"README.md: no ```{lang} block under a '## {heading}' heading")


def tour_commands(readme: Path = ROOT / "README.md", heading: str = TOUR_HEADING) -> list:
    """The commands of the README's ``sh`` block under ``heading`` (the tour's), each as
    its words (comments dropped)."""
    cmds = [shlex.split(line, comments=True)
            for line in readme_block(heading, "sh", readme).splitlines()]
    return [c for c in cmds if c]


def machine() -> dict:
    """The machine in words: CPU model, logical cores, memory, load average now."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = None
    try:
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        mem = round(kb / 2**20, 1)
    except (OSError, ValueError, IndexError):
        pass
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {"cpu": model, "cores": os.cpu_count(), "memory_gib": mem,
            "load_1min": None if load is None else round(load[0], 2),
            "python": platform.python_version()}


def describe(m: dict) -> str:
    return (f"{m['cpu']}, {m['cores']} logical cores"
            + (f", {m['memory_gib']} GiB" if m["memory_gib"] else "")
            + (f", load {m['load_1min']} before the tour" if m["load_1min"] is not None else ""))


def installed_copy(site: Path) -> Path:
    """This checkout's two packages copied to ``site`` (no caches, no write-back
    history): imported from there, ``evolve`` keeps its data and runs in the working
    directory, as a wheel install does (``evolve.io.paths``)."""
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", "*.nbi", "*.nbc", "history",
                                  ".*.lock")
    for top in ("evolve", "heuristics"):
        shutil.copytree(ROOT / top, site / top, ignore=skip)
    return site


def run_tour(work: Path, site: Path, cache: Path, label: str,
             heading: str = TOUR_HEADING) -> list[dict]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("EVOLVE_") and k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PYTHONPATH=str(site), NUMBA_CACHE_DIR=str(cache), NO_COLOR="1",
               COLUMNS="120")
    steps = []
    print(f"{label}:", flush=True)
    for i, cmd in enumerate(tour_commands(heading=heading), 1):
        argv = [sys.executable, "-m", "evolve", *cmd[1:]] if cmd[0] == "evolve" else cmd
        t0 = time.perf_counter()
        p = subprocess.run(argv, cwd=work, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
        seconds = time.perf_counter() - t0
        (work / f"step-{i}.out").write_text(p.stdout)
        steps.append({"command": shlex.join(cmd), "seconds": round(seconds, 1),
                      "exit": p.returncode})
        print(f"{seconds:7.1f} s  {shlex.join(cmd)}" + ("" if p.returncode == 0 else
                                                         f"  (exit {p.returncode})"),
              flush=True)
        if p.returncode != 0:
            print(p.stdout[-2000:], file=sys.stderr)
            break
    print(f"{sum(s['seconds'] for s in steps):7.1f} s  in all ({len(steps)} steps)",
          flush=True)
    return steps


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--section", default=TOUR_HEADING,
                    help="the README heading whose sh block is timed (default: the tour's)")
    ap.add_argument("--again", action="store_true",
                    help="then the tour again, with the kernels the first one compiled")
    ap.add_argument("--keep", type=Path, help="run in this new directory and keep it")
    ap.add_argument("--json", type=Path, help="also write the figures here as JSON")
    args = ap.parse_args(argv)
    m = machine()
    print(f"machine: {describe(m)}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) if args.keep is None else args.keep.resolve()
        if args.keep is not None:
            root.mkdir(parents=True, exist_ok=False)
        site = installed_copy(Path(tmp) / "site")
        cache = Path(tmp) / "numba-cache"
        tours = {}
        for label in ("first", "again")[:1 + args.again]:
            (root / label).mkdir()
            tours[label] = run_tour(root / label, site, cache,
                                    "first time (an empty Numba cache: kernels compile)"
                                    if label == "first" else
                                    "again (the kernels the first time compiled)",
                                    args.section)
    doc = {"machine": m, "section": args.section, **{label: {"steps": steps,
                                    "total_seconds": round(sum(s["seconds"] for s in steps),
                                                           1)}
                            for label, steps in tours.items()}}
    if args.json is not None:
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
    return 0 if all(s["exit"] == 0 for steps in tours.values() for s in steps) else 1


if __name__ == "__main__":
    sys.exit(main())
