"""The walk of ``--data`` and of ``--device`` through the packages, from the command line to
the first kernel call, counted: how many package boundaries it crosses and how many of
them go back up (to a layer above the one it was in).

    python -m benchmarks.checks.walk [--json]

It runs a tiny ``evolve run`` in this process (token splits of datasets/, one generation
of eight trees, no write-back, a temporary runs directory) under ``sys.setprofile`` and
keeps, in call order, every call of a function of ``evolve`` that is handed the value (as
an argument, or as an attribute of one: a run's options' data directory, a
configuration's device) or, for ``--data``, the data read from it (a split, the arrays a
kernel reads, an evaluator, a dict of them). A method called on the value itself (a
configuration validating itself, a split giving its columns) reads it where it is and is
not a step. The walk ends at the first call of a population kernel: the Numba one for
``--data``, the device one for ``--device cuda`` (run on torch's CPU device:
``EVOLVE_TORCH_DEVICE=cpu``, ``EVOLVE_GPU_KERNEL=torch``; skipped without torch).
Consecutive calls in one package are one step; dunder methods such as ``__len__`` are not
counted. A step to a package of a lower layer goes
down, to a higher one back up; the layers, top first, are those of docs/internals.md
(``LAYERS``). Works on any checkout of the project (run it with that checkout first on
``PYTHONPATH``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
from pathlib import Path

from benchmarks.common import ROOT

# Top first: each imports only packages below it (tests/test_imports.py checks no cycle).
LAYERS = ("evolve.cli", "evolve.api", "evolve.export", "evolve.runs", "evolve.tasks",
          "evolve.search", "evolve.freerun", "evolve.rules", "evolve.cluster",
          "evolve.objectives", "evolve.kernels", "evolve.data.sources", "evolve.data",
          "evolve.lang", "evolve.io", "evolve.errors")
IGNORED = ("__len__", "__iter__", "__getitem__", "__eq__", "__hash__", "__repr__", "__str__",
           "__contains__", "__bool__", "<lambda>", "<genexpr>", "<listcomp>", "<dictcomp>")
DATA_TYPES = ("Dataset", "TraceSplit", "ShardedSplit", "TokenArrays", "TraceArrays",
              "ArraySplit", "ClusterSplit", "Evaluator", "TaskData")


def package(module: str) -> str | None:
    """The layer of module ``module`` (the longest of ``LAYERS`` it is in), or None."""
    found = [p for p in LAYERS if module == p or module.startswith(p + ".")]
    return max(found, key=len) if found else None


def rank(pkg: str) -> int:
    return LAYERS.index(pkg)


class Walk:
    """The calls of ``evolve`` that carry a value, until the first kernel call."""

    def __init__(self, carries, end):
        self.carries, self.end = carries, end
        self.steps: list[tuple[str, str]] = []     # (package, qualified function)
        self.done = False

    def __call__(self, frame, event, arg):
        if self.done or event != "call":
            return
        module = frame.f_globals.get("__name__", "")
        pkg = package(module)
        if pkg is None:
            return
        code = frame.f_code
        if code.co_name in IGNORED:
            return
        n = code.co_argcount + code.co_kwonlyargcount + bool(code.co_flags & 0x04) \
            + bool(code.co_flags & 0x08)            # *args, **kwargs
        names = code.co_varnames[:n]
        if names and names[0] in ("self", "cls"):
            names = names[1:]                  # a method of the value only reads it
        args = [frame.f_locals.get(name) for name in names]
        if any(self.carries(a) for a in args):
            caller = frame.f_back
            while caller is not None and package(caller.f_globals.get("__name__", "")) is None:
                caller = caller.f_back
            by = package(caller.f_globals.get("__name__", "")) if caller is not None else None
            self.steps.append((pkg, f"{module}.{code.co_qualname}", by))
            if self.end(module, code.co_name):
                self.done = True

    def summary(self) -> dict:
        """``boundaries``: steps from one package to another; ``back_up``: those to a
        higher layer (the walk returned up and went down again); ``reentered``: steps
        into a package the walk had left; ``upward_calls``: calls from a lower layer
        into a higher one (a layer calling back up the stack)."""
        path = []
        upward = []
        for pkg, fn, by in self.steps:
            if not path or path[-1]["package"] != pkg:
                path.append({"package": pkg, "calls": []})
            path[-1]["calls"].append(fn)
            if by is not None and rank(pkg) < rank(by):
                upward.append(f"{by} -> {fn}")
        moves = [(a["package"], b["package"]) for a, b in zip(path, path[1:])]
        ups = [f"{a} -> {b}" for a, b in moves if rank(b) < rank(a)]
        seen, again = set(), []
        for p in path:
            if p["package"] in seen:
                again.append(p["package"])
            seen.add(p["package"])
        return {"reached_kernel": self.done, "boundaries": len(moves), "back_up": len(ups),
                "ups": ups, "reentered": len(again), "upward_calls": upward,
                "path": [p["package"] for p in path], "calls": [p["calls"] for p in path]}


def _is_data(x, data_dir: str, depth: int = 0) -> bool:
    if isinstance(x, (str, os.PathLike)) and not isinstance(x, bytes):
        try:
            return os.path.abspath(os.fspath(x)) == data_dir
        except TypeError:
            return False
    if type(x).__name__ in DATA_TYPES:
        return True
    if getattr(x, "data_dir", None) is not None and depth == 0:
        return _is_data(x.data_dir, data_dir, 1)
    if isinstance(x, dict) and depth == 0:
        return any(_is_data(v, data_dir, 1) for v in list(x.values())[:8])
    return False


def _is_device(x, name: str, depth: int = 0) -> bool:
    if isinstance(x, str):
        return x == name
    if isinstance(x, dict) and depth == 0:
        return x.get("device") == name
    if type(x).__name__ == "device" and type(x).__module__ == "torch":
        return True                                 # the torch device it resolves to
    for holder in (x, getattr(x, "config", None)):
        value = getattr(holder, "device", None) if holder is not None else None
        if isinstance(value, str) and value == name:
            return True
    return False


def walk(value: str, device: str = "cpu") -> dict:
    """The walk of ``--data`` (``value`` "data") or ``--device`` ("device") in a tiny run."""
    from click.testing import CliRunner
    from evolve.cli import main
    data_dir = str((ROOT / "datasets").resolve())
    if value == "data":
        w = Walk(lambda x: _is_data(x, data_dir),
                 lambda m, f: m.startswith("evolve.kernels.") and ".gpu" not in m
                 and f.startswith("population_"))
    else:
        w = Walk(lambda x: _is_device(x, device),
                 lambda m, f: m.startswith("evolve.kernels.gpu.") and f.startswith("population_"))
    with tempfile.TemporaryDirectory() as tmp:
        args = ["run", "--data", data_dir, "--generations", "1", "--population", "8",
                "--runs-dir", str(Path(tmp) / "runs"), "--name", "walk", "--no-writeback",
                "--json", "--device", device]
        sys.setprofile(w)
        try:
            r = CliRunner().invoke(main, args)
        finally:
            sys.setprofile(None)
    out = w.summary()
    out["exit_code"] = r.exit_code
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print the walks as JSON")
    args = ap.parse_args(argv)
    walks = {"--data": walk("data")}
    if importlib.util.find_spec("torch") is not None:
        os.environ.setdefault("EVOLVE_TORCH_DEVICE", "cpu")
        os.environ.setdefault("EVOLVE_GPU_KERNEL", "torch")
        walks["--device"] = walk("device", "cuda")
    if args.json:
        print(json.dumps(walks, indent=1))
        return 0
    for name, w in walks.items():
        print(f"{name}: {w['boundaries']} package boundaries, {w['back_up']} back up, "
              f"{w['reentered']} into a package already left, {len(w['upward_calls'])} "
              f"calls up a layer (kernel reached: {w['reached_kernel']}, exit code "
              f"{w['exit_code']})")
        print("  " + " -> ".join(p.removeprefix("evolve.") for p in w["path"]))
        for up in w["upward_calls"]:
            print(f"  call up: {up}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
