"""`evolve benchmark --device cuda`: every heuristic's tree scored and timed by the
device token kernel (``evolve.kernels.gpu.tokens``: the fused Triton kernel, or the
torch one, as ``evolve.kernels.gpu.choice.kernel_for`` chooses) on a torch device.

A baseline's tree comes from the rules table (``evolve.rules.table``); the
installed ``heuristics/evolved.py``'s from its ``METADATA`` literal, used only when
the module's function is exactly the code generated from that tree
(``evolved_tree``), else that row is timed on the CPU by its compiled function and
``fallback`` says why. The metrics come from the kernel's integer counts
(``Counts.from_raw``), the same numbers as the compiled functions' on the CPU (both
device kernels equal the Numba population kernel bit for bit, which equals the
generated code). The timed work is one kernel call on a split whose columns are on
the device already (as in a run; a split larger than the memory budget is streamed
from the host, as in a run, and ``streamed`` names it), between two
synchronizations; the median of ``repeats`` is reported. ``evolve.runs.report.benchmark``
calls this module.
"""

from __future__ import annotations

import ast
import inspect
import statistics
import sys
import textwrap
import time

from evolve.kernels.gpu import choice
from evolve.objectives import placement
from evolve.lang import codegen, treeio
from evolve.objectives.metrics import Counts
from evolve.rules import table
from heuristics import ops, registry
from evolve.io.paths import heuristics_dir

CPU_TIMING = {"device": "cpu", "by": "compiled per-rule functions (Numba)"}
DEVICE_TIMING = {"fused": "fused token kernel (Triton), the split's columns on the device",
                 "torch": "torch token kernel, the split's columns on the device"}


class DeviceBench:
    """Scores and times heuristics' trees on ``device`` ("cuda"); a one-line
    ``DeviceError`` (parameter ``device``) when torch or the device is missing."""

    def __init__(self, device: str):
        self.device = device
        resolved = placement.resolve(device)
        self.dev = resolved.torch
        from evolve.kernels.gpu import tokens  # lazy: torch, only on the device path
        self._tokens = tokens
        self._kernel = resolved.guarded(tokens.population_counts)     # resolved once, above
        self.fallback: dict[str, str] = {}
        self.streamed: set[str] = set()     # splits too large to be resident (streamed)

    def timing(self) -> dict:
        """Which device timed the rows, by what, torch's name for it, and the rows
        timed on the CPU instead (name: why)."""
        import torch  # lazy: torch, only on the device path
        if self.dev.type == "cuda":
            index = self.dev.index if self.dev.index is not None else torch.cuda.current_device()
            where, name = f"cuda:{index}", torch.cuda.get_device_name(index)
        else:
            where = str(self.dev)
            name = f"{self.dev.type}, torch threads: {torch.get_num_threads()}"
        out = {"device": self.device, "by": DEVICE_TIMING[choice.kernel_for(self.dev)],
               "torch_device": where, "name": name, "fallback": self.fallback}
        if self.streamed:
            out["streamed"] = sorted(self.streamed)
        return out

    def rows(self, name: str, prepared: dict, repeats: int) -> dict | None:
        """{split: metrics with eval_ms} of heuristic ``name`` on the device, or None
        when it must be scored on the CPU (the reason, if any, in ``fallback``)."""
        if name == registry.EVOLVED:
            try:
                fn = registry.get(name, heuristics_dir())
            except Exception:  # noqa: BLE001 -- hand-edited: the CPU path reports it as skipped
                return None
            nodes, why = evolved_tree(fn)
            if nodes is None:
                self.fallback[name] = why
                return None
        else:
            nodes = treeio.parse(table.get(name).tree())
        progs = treeio.linearise([nodes])
        return {split: self._score(progs, split, ps, repeats) for split, ps in prepared.items()}

    def _score(self, progs, split: str, ps, repeats: int) -> dict:
        raw = self._counts(progs, ps.arrays)     # also puts the columns on the device
        if getattr(self._tokens.device_split(ps.arrays, self.dev), "streaming", False):
            self.streamed.add(split)
        metrics = Counts.from_raw(ps.n, raw[0]).metrics()
        times = []
        for _ in range(max(1, repeats)):
            self._sync()
            t0 = time.perf_counter()
            self._counts(progs, ps.arrays)
            self._sync()
            times.append(time.perf_counter() - t0)
        metrics["eval_ms"] = statistics.median(times) * 1e3
        return metrics

    def _counts(self, progs, arrays):
        return self._kernel(progs, arrays, device=self.dev)

    def _sync(self) -> None:
        if self.dev.type == "cuda":
            import torch  # lazy: torch, only on the device path
            torch.cuda.synchronize(self.dev)


def evolved_tree(fn) -> tuple[list | None, str]:
    """(tree, "") of the installed evolved.py's function ``fn`` when its code is the
    code generated from the tree in its module's ``METADATA`` (signature and return
    expression compared as syntax trees, helpers those of ``heuristics.ops``);
    (None, why) otherwise: a hand-edited file is timed by its own compiled code."""
    mod = sys.modules.get(getattr(fn, "__module__", None) or "")
    meta = getattr(mod, "METADATA", None)
    text = meta.get("tree") if isinstance(meta, dict) else None
    if not isinstance(text, str):
        return None, "no tree in its METADATA"
    try:
        nodes = treeio.parse(text)
    except treeio.TreeError as e:
        return None, f"the tree in its METADATA does not parse ({str(e)[:200]})"
    if codegen.uses_trace_inputs(nodes):
        return None, "its tree reads trace features"
    try:
        found = ast.parse(textwrap.dedent(inspect.getsource(fn))).body[0]
        want = ast.parse(codegen.function_source(nodes, "evolved")).body[0]
    except (OSError, TypeError, SyntaxError, ValueError, IndexError, RecursionError):
        return None, "the source of its function cannot be read"
    if not (isinstance(found, ast.FunctionDef) and not found.decorator_list
            and ast.dump(found.args) == ast.dump(want.args)
            and _statements(found) == _statements(want)):
        return None, "its function is not the code of the tree in its METADATA (hand-edited?)"
    for helper in codegen.helpers_used(nodes):
        if getattr(mod, helper, None) is not getattr(ops, helper, None):
            return None, f"its {helper} is not heuristics.ops.{helper}"
    return nodes, ""


def _statements(fn: ast.FunctionDef) -> list[str]:
    """The function's statements as text, without a leading docstring."""
    body = fn.body
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None),
                                                             ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]
    return [ast.dump(s) for s in body]
