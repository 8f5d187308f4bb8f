"""Task traces: the problems of a split decoded by speculative decoding with the
standard rule, greedy or sampled, each up to the end of its answer, with
critical-token labels.

``record_split`` decodes every problem of a split of a task pair (the built-in
``pair.TaskPair`` or your own, ``hf_pair.HFTaskPair``) with
``evolve.data.decode.decode`` (a problem stops at the end of its text: the pair's
``end`` token, or its budget of generated tokens) and keeps the blocks that began
before that end, as trace rows of schema v3 (``sequence`` is the problem's number). ``meta["decoding"]`` says how: "greedy" (the draft proposes its argmax, the
standard rule keeps a draft iff it is the target's argmax) or "sample". Then every
drafted token the standard rule could reject is labelled critical or not
(``evolve.data.labels``: substituted, continued by the target to the end, the
answer checked against the one without it).

Labels are their own file beside the traces (``<split>.labels.npz``, ``LABELS_VERSION``)
naming the traces they label by checksum, so traces stay readable by everything that
reads traces, and a labels file can be remade or refused on its own.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from evolve.data import labels as LB
from evolve.data import vocab_class as VC
from evolve.data import tokens as D
from evolve.data import traces as T
from evolve.data.sources.task.checker import DelimiterChecker
from evolve.data.tokens import DataError
from evolve.io.atomic import sha256_file

MODES = LB.MODES
LABELS_VERSION = LB.LABELS_VERSION
CHECKER = DelimiterChecker()          # the arithmetic task's "#### answer"


def max_new_of(pair, split: str) -> int:
    """Blocks a split's texts decode at most (``TaskPair.max_new``)."""
    return pair.max_new(split)


@dataclass
class TaskSplit:
    """A split of task traces: the traces and each row's label (``evolve.data.labels``)."""
    traces: T.TraceSplit
    critical: np.ndarray
    labels_meta: dict

    @property
    def name(self) -> str:
        return self.traces.name

    @property
    def meta(self) -> dict:
        return self.traces.meta

    @property
    def columns(self) -> dict:
        """The traces' columns and the labels (``critical``): what a run's checksum of
        the split covers."""
        return {**self.traces.columns, "critical": self.critical}

    def __len__(self) -> int:
        return len(self.traces)


def record_traces(pair, split: str, mode: str, prompts: int | None = None,
                  meter=None) -> T.TraceSplit:
    """The traces of a split's first ``prompts`` problems (all: None) of a task pair
    (the built-in ``TaskPair``, or ``hf_pair.HFTaskPair``), decoded with the standard
    rule. ``meter(label, total, unit)``, when given (``evolve.cli.render``), counts the
    problems decoded."""
    if mode not in MODES:
        raise ValueError(f"mode {mode!r}: expected one of {', '.join(MODES)}")
    greedy = mode == "greedy"
    H, rngs = pair.prompts(split, prompts)
    max_new = pair.max_new(split)
    with (meter(f"{split}: decoding", len(H), "problems") if meter
          else contextlib.nullcontext()) as m:
        cols, _ = pair.decode(H, rngs, max_new, None if m is None else m.advance, record=True,
                              greedy=greedy, end=pair.end, max_tokens=pair.max_tokens)
    live = cols.pop("live")
    cols = {f: np.ascontiguousarray(v[live]) for f, v in cols.items()}
    cfg = pair.config
    meta = {"format_version": T.RANK_VERSION, "rows": int(live.sum()), "name": split,
            "backend": "task", "block_size": cfg.block_size, "top_k": cfg.top_k,
            "context_len": cfg.context_len, "config": cfg.to_dict(), "decoding": mode,
            "task": {**pair.task_meta(), "problems": len(H)},
            "models": pair.describe()}
    if getattr(pair, "vocab", None) is not None:
        meta["vocab_size"] = pair.vocab
    classes = VC.table(pair)
    if classes is not None:
        meta[VC.META_KEY] = VC.to_text(classes)
    ts = T.TraceSplit(cols, meta, split)
    T.validate(ts, f"<{split} task traces>")
    return ts


def labels_meta(mode: str, rows: int, cost: dict) -> dict:
    """The labels file's meta (``traces_sha256`` is added when it is written)."""
    return {"labels_version": LABELS_VERSION, "kind": "answer change", "decoding": mode,
            "rows": rows, "mined": cost}


def record_split(pair, split: str, mode: str, seed: int = 0,
                 prompts: int | None = None, meter=None, max_memory: int | None = None,
                 reuse: bool = True) -> TaskSplit:
    """The traces (``record_traces``) and labels of a split's first ``prompts`` problems,
    mined in this process (``evolve.data.labels.mine``: ``max_memory`` bytes bound its
    batches, ``reuse`` computes each distinct continuation once). ``meter(label,
    total, unit)``, when given, counts the problems decoded and the drafts labelled."""
    ts = record_traces(pair, split, mode, prompts, meter)
    greedy = mode == "greedy"
    cols = ts.columns
    need = int(LB.could_reject(cols, greedy).sum())
    with (meter(f"{split}: mining labels", need, "drafts") if meter
          else contextlib.nullcontext()) as m:
        critical, cost = LB.mine(pair, cols, pair.answer_of, pair.done_of, greedy,
                                 pair.max_new(split), seed, pad=pair.pad,
                                 max_tokens=pair.max_tokens,
                                 tick=None if m is None else m.advance,
                                 max_memory=max_memory, reuse=reuse)
    return TaskSplit(ts, critical, labels_meta(mode, len(ts), cost))


def same_recording(meta: dict, pair, split: str, mode: str) -> str:
    """Why traces of this meta are not what the pair records for ``split`` in ``mode``
    ("" when they are): the field that differs, its value and the one expected."""
    want = {"backend": "task", "decoding": mode,
            "config": json.loads(json.dumps(pair.config.to_dict())),
            "problems": len(pair.problems[split])}
    got = {"backend": meta.get("backend"), "decoding": meta.get("decoding"),
           "config": meta.get("config"),
           "problems": (meta.get("task") or {}).get("problems")}
    for key in ("backend", "decoding", "problems"):
        if got[key] != want[key]:
            return f"field '{key}' is {got[key]!r:.40}, now {want[key]!r:.40}"
    cfg = got["config"] if isinstance(got["config"], dict) else {}
    for key, v in want["config"].items():
        if cfg.get(key) != v:
            return f"field 'config.{key}' is {cfg.get(key)!r:.40}, now {v!r:.40}"
    return ""


def labels_path(directory, split: str) -> Path:
    return LB.labels_path(directory, split)


def save(task_split: TaskSplit, directory) -> None:
    """Write ``<split>.npz`` (traces) and ``<split>.labels.npz`` (labels) atomically."""
    directory = Path(directory)
    path = directory / f"{task_split.name}.npz"
    T.save(task_split.traces, path)
    meta = dict(task_split.labels_meta, traces_sha256=sha256_file(path))
    D.write_npz(labels_path(directory, task_split.name), meta,
                {f"{LB.COLUMN}.npy": np.asarray(task_split.critical, dtype=np.int8)})


def check_task_meta(meta: dict, path) -> None:
    """DataError naming ``path`` unless its meta.json is of task traces with a decoding
    they can be decoded by again (greedy or sample; any other would be taken for one of
    them)."""
    if meta.get("backend") != "task" or "decoding" not in meta:
        raise DataError(f"{path}: not task traces (meta.json has no task decoding); record "
                        "them with `evolve data task`")
    if meta["decoding"] not in MODES:
        raise DataError(f"{path}: field 'decoding' is {meta['decoding']!r:.40}; expected "
                        f"{' or '.join(MODES)}")


def load(directory, split: str) -> TaskSplit:
    """A split's traces and labels, checked: the labels name these traces (checksum),
    hold one label per row, and every row the standard rule could reject has one;
    DataError naming the file and field otherwise."""
    directory = Path(directory)
    path = directory / f"{split}.npz"
    ts = T.load(path, name=split)
    check_task_meta(ts.meta, path)
    meta, crit = LB.load_labels(labels_path(directory, split), path, ts)
    return TaskSplit(ts, crit, meta)
