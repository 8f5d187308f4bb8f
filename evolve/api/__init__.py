"""The Python API: everything the command line does, as functions and plain results.

    import evolve
    result = evolve.run(objective="speed", tv_budget=0.02, data_dir="datasets/traces")
    rule = result.rule                               # an evolve.Rule
    t = evolve.tradeoff("datasets/traces", budgets=[0.01], runs=[result])
    c = evolve.compare(["leniency:0.94", rule], data_dir="datasets/traces", prompts=512)
    evolve.export(result, format="hf", out="rule_hf.py")
    evolve.trace("datasets/traces")

- ``evolve.api.runs``: ``run``, ``load_run``, ``RunResult`` (`evolve run`);
- ``evolve.api.acceptance_rule``: ``Rule``, a champion as an object (threshold, acceptance,
  sympy, numpy, torch, source);
- ``evolve.api.tradeoffs``: ``tradeoff``, ``Tradeoff`` (`evolve tradeoff`);
- ``evolve.api.comparisons``: ``compare``, ``Comparison`` (`evolve simulate --compare`);
- ``evolve.api.record``: ``trace``, ``TraceResult`` (`evolve data trace`);
- ``evolve.export.front``: ``export``, ``Export`` (`evolve export`).

The command line is a thin layer over these: it parses options, calls them and
renders their results, so both take the same defaults and refuse the same input
with the same one-line errors (the command line names its option, ``--budget``,
where the API names its parameter, ``budgets``). Names are loaded on first use, so
``import evolve.api`` stays light.
"""

from __future__ import annotations

NAMES = {"run": "runs", "load_run": "runs", "RunResult": "runs", "Rule": "acceptance_rule",
         "tradeoff": "tradeoffs", "Tradeoff": "tradeoffs", "compare": "comparisons",
         "Comparison": "comparisons", "trace": "record", "TraceResult": "record",
         "export": "evolve.export.front", "Export": "evolve.export.front"}
__all__ = sorted(NAMES)


def __getattr__(name: str):
    if name not in NAMES:
        raise AttributeError(f"module 'evolve.api' has no attribute {name!r}")
    import importlib    # lazy: each name loads its module on first use
    module = NAMES[name] if "." in NAMES[name] else f"evolve.api.{NAMES[name]}"
    return getattr(importlib.import_module(module), name)
