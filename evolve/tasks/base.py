"""What a data world provides (``Task``) and what a finished run hands it (``Finished``);
see ``evolve.tasks``."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Finished:
    """A finished run as a task reports it (built by the runner from its engine, so
    a task reads a run's result, never the engine): the configuration, the splits
    and the evaluators of train and valid, the champion's parsed tree and metrics,
    the hall of fame's trees (best first) and the final population."""

    config: object
    splits: dict
    evaluators: dict
    nodes: list
    metrics: dict
    hof_trees: list = field(default_factory=list)
    population: list = field(default_factory=list)
    selection: dict | None = None   # how the champion was chosen, where the world says


class Task:
    """Base class of a data world; subclasses set the attributes and override what
    differs. The defaults are those of a world with nothing to add."""

    name: str = ""
    trace_inputs: bool = False      # the rules read the trace inputs (evolve.lang.features)
    module: str | None = None       # heuristics module champions are written back to
    installed: str | None = None    # `evolve export --installed` name of that module
    writes_back: str = ""           # how a champion gets there (said when none has)
    figure: str = "fitness"         # the metric starts are summarised by on test
    metric_keys: tuple = ()         # every split's metrics in champion.json hold these
    tuned_metric_keys: tuple = ("tokens_per_call", "tv_per_token", "kl_per_token")
    #                                 ... and those of its baselines_tuned_on_valid
    header_keys: tuple = ()         # a split's metrics a module's header and `evolve runs`
    #                                 show (none: every metric in the header, `figure` in runs)

    def default_data(self) -> Path:
        """Where the world's splits are when no --data is given."""
        raise NotImplementedError

    def load_splits(self, config, data_dir: Path, session=None) -> dict:
        """train/valid/test, checked (``session``: a cluster session, or None)."""
        raise NotImplementedError

    def select(self, result: Finished, say=None) -> dict | None:
        """How the world chooses the champion beyond the run's valid score: a record
        with the chosen rule's ``tree`` (it becomes the champion) and what it was
        judged on, or None (the run's champion stands; ``result.metrics`` is not yet
        set). ``say(text)`` reports progress."""
        return None

    def report(self, result: Finished) -> dict:
        """What a finished run adds: ``{"champion": fields added to champion.json,
        "files": {run file name: JSON document}}``."""
        return {"champion": {}, "files": {}}

    def header_metrics(self, m: dict) -> dict:
        """The metrics of one split a generated module's header and METADATA carry."""
        return {k: m[k] for k in self.header_keys} if self.header_keys else m

    def install(self, nodes, source: str, meta: dict, valid_metrics: dict, valid,
                evaluator, config, run_name: str, opts) -> dict | None:
        """Write the champion back to the world's heuristics module; the decision,
        or None for a world with no such module (``valid``: the valid split;
        ``evaluator``: its evaluator when the run has one)."""
        return None

    def runs_columns(self, metrics: dict) -> dict:
        """``evolve runs``' figures of a champion (valid and test)."""
        return {f"{split}_{key}": metrics[split][key]
                for split in ("valid", "test") for key in self.header_keys or (self.figure,)}

    def runs_text(self, row: dict, split: str) -> str:
        """A champion's figure on ``split`` as ``evolve runs`` prints it, from the
        columns of ``runs_columns``."""
        return f"{row[f'{split}_{self.figure}']:.4f}"

    def __repr__(self) -> str:
        return f"<task {self.name}>"
