"""Speculative-decoding traces (datasets/traces/): in memory (.npz) or sharded.

Splits are ``evolve.data.traces`` TraceSplits, or shards scored where they are
(``evolve.data.shards``, ``evolve.cluster``); champions are scored by the trace
objectives (``evolve.objectives.speculative``), reported beside every rule family
tuned to the run's budget, and written back to heuristics/evolved_trace.py when
their valid speed score beats the installed trace rule's.
"""

from __future__ import annotations

from pathlib import Path

from evolve.tasks.base import Task

HEADER_KEYS = ("tokens_per_call", "tv_per_token")


class TraceTask(Task):
    name = "traces"
    trace_inputs = True
    module = "evolved_trace"
    installed = "trace"
    writes_back = "`evolve run --objective speed` writes one back"
    figure = "tokens_per_call"
    metric_keys = ("tokens_per_call", "tv_per_token", "kl_per_token")

    def default_data(self) -> Path:
        from evolve.runs.paths import TRACES_DIR
        return TRACES_DIR

    def load_splits(self, config, data_dir: Path, session=None) -> dict:
        from evolve.cluster.session import Session
        from evolve.data import shards, traces
        from evolve.data.tokens import DataError
        from evolve.search.config import ConfigError
        session = session or Session()
        if shards.is_sharded(data_dir):
            return session.attach(shards.load_splits(data_dir))
        session.attach({})
        if not Path(data_dir).is_dir():
            raise DataError(f"{data_dir}: no trace data (build it with `evolve data trace`, "
                            "about 2 s, or `make traces`)")
        train = Path(data_dir) / "train.npz"
        if train.exists() and not traces.is_trace_file(train):
            raise ConfigError.of("objective", f"{config.objective!r} needs speculative-"
                                 "decoding traces (make them with `evolve data trace`); "
                                 f"{data_dir} holds token splits")
        return traces.load_splits(data_dir)

    def report(self, result) -> dict:
        from evolve.objectives import OBJECTIVES
        return OBJECTIVES[result.config.objective].report(result)

    def header_metrics(self, m: dict) -> dict:
        return {k: m[k] for k in HEADER_KEYS}

    def install(self, nodes, source, meta, valid_metrics, valid, evaluator, config,
                run_name, opts):
        from evolve.lang import codegen
        from evolve.objectives.speculative import spec_arrays
        from evolve.runs.writeback import write_back_trace
        sa = spec_arrays("valid", {"valid": valid}, {"valid": evaluator})
        return write_back_trace(codegen.module_source(
            nodes, "evolved_trace", meta, f"Evolved trace acceptance rule (run {run_name})",
            trace=True), nodes, sa, config.tv_budget, run_name,
            force=opts.force, directory=opts.heuristics_dir)

    def runs_columns(self, metrics: dict) -> dict:
        return {f"{split}_{key}": metrics[split][key]
                for split in ("valid", "test") for key in HEADER_KEYS}
