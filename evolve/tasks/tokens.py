"""Token splits (datasets/): the original benchmark's world.

Splits are ``evolve.data.tokens`` TokenSplits; champions are scored by the seed
metric (``evolve.objectives.tokens``) and written back to heuristics/evolved.py
when their valid fitness beats the installed rule's.
"""

from __future__ import annotations

from pathlib import Path

from evolve.tasks.base import Task
from evolve.io.paths import DATA_DIR
from evolve.data import tokens as data
from evolve.tasks.writeback import write_back


class TokenTask(Task):
    name = "tokens"
    trace_inputs = False
    module = "evolved"
    installed = "tokens"
    writes_back = "`evolve run` writes one back"
    figure = "fitness"
    metric_keys = ("accept_rate", "accuracy", "quality", "fitness")

    def default_data(self) -> Path:
        return DATA_DIR

    def load_splits(self, config, data_dir: Path, session=None) -> dict:
        if session is not None and session.distributed:
            session.attach({})          # raises: a cluster needs sharded traces
        return data.load_splits(data_dir)

    def install(self, nodes, source, meta, valid_metrics, valid, evaluator, config,
                run_name, opts):
        return write_back(source, valid_metrics["fitness"], valid, run_name,
                          force=opts.force, directory=opts.heuristics_dir)
