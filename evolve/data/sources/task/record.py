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
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from evolve.data import labels as LB
from evolve.data import tokens as D
from evolve.data import traces as T
from evolve.data.sources.task.checker import DelimiterChecker
from evolve.data.tokens import DataError
from evolve.errors import first_line
from evolve.io import jsonio
from evolve.io.atomic import sha256_file

MODES = ("greedy", "sample")
LABELS_VERSION = 1
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


def record_split(pair, split: str, mode: str, seed: int = 0,
                 prompts: int | None = None, meter=None) -> TaskSplit:
    """The traces and labels of a split's first ``prompts`` problems (all: None) of a
    task pair (the built-in ``TaskPair``, or ``hf_pair.HFTaskPair``). ``meter(label,
    total, unit)``, when given (``evolve.cli.render``), counts the problems decoded and
    the drafts labelled."""
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
    meta = {"format_version": T.SLOT_VERSION, "rows": int(live.sum()), "name": split,
            "backend": "task", "block_size": cfg.block_size, "top_k": cfg.top_k,
            "context_len": cfg.context_len, "config": cfg.to_dict(), "decoding": mode,
            "task": {**pair.task_meta(), "problems": len(H)},
            "models": pair.describe()}
    if getattr(pair, "vocab", None) is not None:
        meta["vocab_size"] = pair.vocab
    ts = T.TraceSplit(cols, meta, split)
    T.validate(ts, f"<{split} task traces>")
    need = int(LB.could_reject(cols, greedy).sum())
    with (meter(f"{split}: mining labels", need, "drafts") if meter
          else contextlib.nullcontext()) as m:
        critical, cost = LB.mine(pair, cols, pair.answer_of, pair.done_of, greedy, max_new,
                                 seed, pad=pair.pad, max_tokens=pair.max_tokens,
                                 tick=None if m is None else m.advance)
    return TaskSplit(ts, critical, {"labels_version": LABELS_VERSION, "kind": "answer change",
                                    "decoding": mode, "rows": len(ts), "mined": cost})


def labels_path(directory, split: str) -> Path:
    return Path(directory) / f"{split}.labels.npz"


def save(task_split: TaskSplit, directory) -> None:
    """Write ``<split>.npz`` (traces) and ``<split>.labels.npz`` (labels) atomically."""
    directory = Path(directory)
    path = directory / f"{task_split.name}.npz"
    T.save(task_split.traces, path)
    meta = dict(task_split.labels_meta, traces_sha256=sha256_file(path))
    D.write_npz(labels_path(directory, task_split.name), meta,
                {"critical.npy": np.asarray(task_split.critical, dtype=np.int8)})


def _read_labels(path: Path):
    """(meta, critical) of a labels file, read as split files are (never unpickled,
    capped, one DataError line naming the file)."""
    jsonio.check_regular(path, "labels file", DataError)
    try:
        with zipfile.ZipFile(path) as zf:
            if "meta.json" not in set(zf.namelist()):
                raise DataError(f"{path}: meta.json is missing (not a labels file)")
            meta = D.read_meta(zf, str(path))
            if not isinstance(meta, dict):
                raise DataError(f"{path}: meta.json must be an object")
            crit = D.read_members(zf, str(path), {"critical": "critical.npy"})["critical"]
    except DataError:
        raise
    except (zipfile.BadZipFile, KeyError, ValueError, OSError, EOFError) as e:
        raise DataError(f"{path}: cannot read the labels ({first_line(e)})") from None
    return meta, crit


def load(directory, split: str) -> TaskSplit:
    """A split's traces and labels, checked: the labels name these traces (checksum),
    hold one label per row, and every row the standard rule could reject has one;
    DataError naming the file and field otherwise."""
    directory = Path(directory)
    path = directory / f"{split}.npz"
    ts = T.load(path, name=split)
    if ts.meta.get("backend") != "task" or ts.meta.get("decoding") not in MODES:
        raise DataError(f"{path}: not task traces (meta.json has no task decoding); record "
                        "them with `evolve data task`")
    lpath = labels_path(directory, split)
    if not os.path.isfile(lpath):
        raise DataError(f"{lpath}: the labels of {path.name} are missing (`evolve data task` "
                        "writes both)")
    meta, crit = _read_labels(lpath)
    if meta.get("labels_version") != LABELS_VERSION:
        raise DataError(f"{lpath}: field 'labels_version' is {meta.get('labels_version')!r}; "
                        f"expected {LABELS_VERSION}")
    if meta.get("traces_sha256") != sha256_file(path):
        raise DataError(f"{lpath}: field 'traces_sha256' does not match {path.name}: the "
                        "labels are of other traces (record both again)")
    if crit.dtype != np.int8 or crit.shape != (len(ts),):
        raise DataError(f"{lpath}: field 'critical' must be int8 of shape ({len(ts)},)")
    bad = np.flatnonzero(~np.isin(crit, (-1, 0, 1)))
    if bad.size:
        raise DataError(f"{lpath}: field 'critical' row {int(bad[0])}: "
                        f"{int(crit[bad[0]])} is not -1, 0 or 1")
    need = LB.could_reject(ts.columns, ts.meta["decoding"] == "greedy")
    missing = np.flatnonzero(need & (crit == LB.UNLABELED))
    if missing.size:
        raise DataError(f"{lpath}: field 'critical' row {int(missing[0])}: no label for a draft "
                        "the standard rule could reject")
    return TaskSplit(ts, crit, meta)
