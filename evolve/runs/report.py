"""What `evolve benchmark`, `evolve inspect` and `evolve runs` compute (drawing them
is ``evolve.cli.render``'s job)."""

from __future__ import annotations

import math
import os
from pathlib import Path

from evolve.data import tokens as data
from evolve.errors import UnknownName
from evolve.objectives import placement
from evolve.lang import codegen, treeio
from evolve.lang.symbolic import sympy_expr
from evolve.runs import device_bench
from evolve.runs.rundir import RunDir, RunError, list_runs
from evolve.tasks import champion_task
from evolve.runs.scoring import PreparedSplit, score
from evolve.tasks.writeback import module_metadata
from evolve.io.paths import heuristics_dir
from heuristics import registry
from evolve.kernels.tokens import population_counts
from evolve.objectives.metrics import Counts
from evolve.rules import table
from evolve.objectives.tokens import threshold_counts
from evolve.objectives.metrics import counts_from_thresholds


# ---------------------------------------------------------------- benchmark

def benchmark(data_dir: Path, heuristics: list[str] | None, repeats: int,
              device: str = "cpu") -> dict:
    """Every heuristic (``heuristics``: these names only) on the token splits of
    ``data_dir``: metrics and eval_ms, the median of ``repeats`` timings. On ``device``
    "cpu" each compiled per-rule function is timed; on "cuda" each tree is scored and
    timed by the device token kernel (``evolve.runs.device_bench``), the
    same metrics. ``timing`` says which device timed the rows."""
    placement.check(device)
    all_names = registry.names()
    names = heuristics or all_names
    unknown = [n for n in names if n not in all_names]
    if unknown:
        raise UnknownName.of("heuristics", f"unknown rule {unknown[0]!r} "
                             f"(known: {', '.join(all_names)})")
    on_device = device_bench.DeviceBench(device) if device != "cpu" else None
    splits = data.load_splits(data_dir)
    prepared = {k: PreparedSplit(v) for k, v in splits.items()}
    found = {}
    if on_device is not None:
        for n in names:
            rows = on_device.rows(n, prepared, repeats)
            if rows is not None:
                found[n] = rows
    skipped = {}
    found.update(_cpu_rows([n for n in names if n not in found], prepared, repeats, skipped))
    out = {"splits": {k: {"tokens": ps.n, "heuristics": {}} for k, ps in prepared.items()},
           "skipped": skipped,
           "timing": dict(device_bench.CPU_TIMING) if on_device is None else on_device.timing()}
    for n in (n for n in names if n in found):
        rows = found[n]
        bad = [split for split, m in rows.items()
               if not all(math.isfinite(v) for v in m.values())]
        if bad and n == registry.EVOLVED:
            skipped[n] = f"gives no finite metrics on {bad[0]}"
            out["timing"].get("fallback", {}).pop(n, None)
            continue
        for split, m in rows.items():
            out["splits"][split]["heuristics"][n] = m
    out["evolved"] = module_metadata(registry.evolved_path(heuristics_dir()))
    return out


def _cpu_rows(names: list[str], prepared: dict, repeats: int, skipped: dict) -> dict:
    """{name: {split: metrics}} of the compiled per-rule functions; a broken
    evolved.py is put in ``skipped`` with the reason."""
    compiled, found = {}, {}
    for n in names:
        try:
            compiled[n] = registry.compiled(n, heuristics_dir())
        except Exception as e:  # noqa: BLE001 -- evolved.py may be hand-edited: anything goes
            if n != registry.EVOLVED:
                raise
            skipped[n] = "cannot be compiled (" + _why(e) + ")"
    for n, f in compiled.items():
        try:
            found[n] = {split: score(f, ps, repeats) for split, ps in prepared.items()}
        except Exception as e:  # noqa: BLE001 -- a hand-edited rule may raise when called
            if n != registry.EVOLVED:
                raise
            skipped[n] = "fails when called (" + _why(e) + ")"
    return found


def run_table(data_dir: Path) -> dict:
    """The table `evolve run` ends with: ``benchmark``'s metrics (no eval ms) of every
    baseline, computed from its tree in the rules table by the population kernel
    the run has loaded already (kernel == generated code, tested), and of the
    installed heuristics/evolved.py by its compiled ufunc; nothing else is compiled."""

    names = registry.names(include_evolved=False)
    progs = treeio.linearise([treeio.parse(table.get(n).tree()) for n in names])
    splits = {k: PreparedSplit(v) for k, v in data.load_splits(data_dir).items()}
    out = {"splits": {k: {"tokens": ps.n, "heuristics": {}} for k, ps in splits.items()},
           "skipped": {}}
    for k, ps in splits.items():
        for n, raw in zip(names, population_counts(progs, ps.arrays)):
            out["splits"][k]["heuristics"][n] = Counts.from_raw(ps.n, raw).metrics()
    try:
        ufunc = registry.compiled(registry.EVOLVED, heuristics_dir())
        rows = {k: score_once(ufunc, ps) for k, ps in splits.items()}
        if all(math.isfinite(v) for m in rows.values() for v in m.values()):
            for k, m in rows.items():
                out["splits"][k]["heuristics"][registry.EVOLVED] = m
    except Exception:  # noqa: BLE001 -- evolved.py may be hand-edited: anything goes
        pass
    out["evolved"] = module_metadata(registry.evolved_path(heuristics_dir()))
    return out


def score_once(ufunc, ps) -> dict:
    """Metrics of a compiled heuristic on a prepared split (untimed)."""
    return threshold_counts(ufunc(*ps.features, out=ps.out), ps.arrays).metrics()


def _why(e: BaseException) -> str:
    first = (str(e).strip().splitlines() or [type(e).__name__])[0]
    return f"{type(e).__name__}: {first}"[:300]


SIMPLIFY_MAX_NODES = 40


def simplified(nodes) -> str | None:
    """A sympy-simplified formula, or None for large trees.

    Protected operators are shown as their plain counterparts (pdiv as /, plog
    as log|x|, ...), so the text reads as the rule does on ordinary inputs; it
    is a reading aid, never evaluated.
    """
    if len(nodes) > SIMPLIFY_MAX_NODES:
        return None
    import sympy as S    # lazy: start-up (SymPy loads only where it is used)
    try:
        return str(S.simplify(sympy_expr(nodes)))
    except (TypeError, ValueError, AttributeError, RecursionError):
        return None


def inspect_run(run: RunDir, simplify: bool = False) -> dict:
    """What `evolve inspect` shows of a run (``--json`` prints it): its config, summary,
    history and champion; ``simplify``: the champion's sympy-simplified formula too
    (``simplified``; None otherwise: sympy costs seconds)."""
    meta = run.meta()
    history = run.history()
    summary = run.summary()
    # no champion.json: the run has not finished; a damaged one is an error
    champ = run.champion() if os.path.lexists(run.file("champion.json")) else None
    out = {"run": run.name, "path": str(run.path), "config": meta.get("config"),
           "versions": meta.get("versions"), "data": meta.get("data"),
           "summary": summary, "generations": len(history), "champion": None,
           "history": {"best_train": [h["best_train"] for h in history],
                       "best_valid": [h["best_valid"] for h in history],
                       "mean_size": [h["mean_size"] for h in history]}}
    pareto = run.pareto()
    if pareto is not None:
        out["pareto"] = pareto
    if champ:
        try:
            nodes = treeio.parse(champ["tree"])   # validates; never evaluated
        except treeio.TreeError as e:
            raise RunError(f"{run.file('champion.json')}: field 'tree': {e}") from None
        out["champion"] = {**champ, "tree": treeio.to_string(nodes),   # canonical text
                           "expression": codegen.infix(nodes),
                           "size": len(nodes), "depth": treeio.depth(nodes),
                           "simplified": simplified(nodes) if simplify else None}
    return out


def standard_metrics(data_dir: Path) -> dict | None:
    """Standard rejection's metrics per split (numpy path; no compilation)."""
    try:
        splits = data.load_splits(data_dir)
    except data.DataError:
        return None
    return {k: counts_from_thresholds(ds.standard_threshold(), ds.rand_value,
                                      ds.baseline_accepts, ds.standard_threshold()).metrics()
            for k, ds in splits.items()}


def runs_table(parent: Path) -> list[dict]:
    rows = []
    for run in list_runs(parent):
        row = {"run": run.name, "status": None, "generation": None, "expression": None,
               "valid_fitness": None, "test_fitness": None}
        try:
            s = run.summary()
            row["status"] = s.get("status", "running or killed")
            row["generation"] = s.get("generation")
            champ = run.champion() if os.path.lexists(run.file("champion.json")) else None
            if champ:
                row["expression"] = codegen.infix(treeio.parse(champ["tree"]))
                task = champion_task(champ)
                row["task"] = task.name
                row.update(task.runs_columns(champ["metrics"]))
        except (RunError, treeio.TreeError, KeyError, TypeError, ValueError) as e:
            # one damaged run is shown as such; the others are still listed
            why = str(e).replace(f"{run.path}{os.sep}", "")     # the file, without the dir
            row = {"run": run.name, "status": f"damaged: {why}", "generation": None,
                   "expression": None, "valid_fitness": None, "test_fitness": None}
        rows.append(row)
    return rows
