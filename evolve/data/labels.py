"""Critical-token labels, mined as AutoJudge mines them.

A drafted token the standard rule could reject (greedy decoding: it is not the
target's argmax; sampling: p(x) < q(x)) is *critical* when accepting it changes the
task's answer. For every such row of a standard-rule recording: the draft's token is
substituted at the row's context, the target continues to the end of the answer,
and the answer is extracted (``answer_of``); the same is done without the
substitution (greedy: the target's argmax there; sampling: the target's own draw, from
the same uniforms as the substituted continuation afterwards, so the two differ only
by the substitution). The label is 1 when the two answers differ, 0 when they agree.

The uniforms of the labelled row numbered i among a split's rows that need a label
are row i mod ``UNIFORM_ROWS`` of ``default_rng((seed, i - i mod UNIFORM_ROWS))``
(max_new + 1 a row: the own draw, then one per continued token; ``row_uniforms``),
whatever the batch, the part of the split or the process that mines the row.

How the continuations are computed is ``evolve.data.label_plan`` (which of them are
the same tokens and need computing once, or not at all) and
``evolve.data.continuations.continue_text`` (a batch of continuations, one forward
pass of the target per generated position over the rows that have not ended, the next
token chosen where the target's probabilities are: on the device for a Hugging Face
pair). ``mine`` returns the labels
and what mining cost: the rows labelled, the target's forward passes (batched calls
of the target) and the rows they read (rows x positions), the continuations needed
and computed, and seconds.
"""

from __future__ import annotations

import os
import time
import zipfile
from pathlib import Path

import numpy as np

from evolve.data import label_plan as LP
from evolve.data import tokens as D
from evolve.data.continuations import continue_text, text_of  # noqa: F401 (the miner's)
from evolve.data.tokens import DataError
from evolve.errors import first_line
from evolve.io import jsonio
from evolve.io.atomic import sha256_file

UNLABELED = -1
UNIFORM_ROWS = 2048       # labelled rows that share one uniform stream (the definition's)
MODES = ("greedy", "sample")          # a task recording's decoding (meta "decoding")
LABELS_VERSION = 1
COLUMN = "critical"                   # the labels' column (int8: 1, 0, UNLABELED)


def could_reject(cols: dict, greedy: bool) -> np.ndarray:
    """The rows a label is needed for: the standard rule could reject their draft."""
    if greedy:
        return np.asarray(cols["token"]) != np.asarray(cols["target_top"])
    return np.asarray(cols["target_prob"]) < np.asarray(cols["draft_prob"])


def row_uniforms(seed: int, index, width: int, per: int | None = None) -> np.ndarray:
    """(n, width) uniforms of the labelled rows numbered ``index`` (their order among a
    split's rows that need a label): row i is row i mod ``per`` of
    ``default_rng((seed, i - i mod per)).random((.., width))``, the stream the first
    miner drew for its batch of ``per`` rows starting at i - i mod ``per``."""
    per = per or UNIFORM_ROWS
    index = np.asarray(index, dtype=np.int64)
    out = np.empty((index.size, width))
    starts = index - index % per
    for s in np.unique(starts):
        sel = starts == s
        j = index[sel] - s
        out[sel] = np.random.default_rng((seed, int(s))).random((int(j.max()) + 1, width))[j]
    return out


def mine(pair, cols: dict, answer_of, done_of, greedy: bool, max_new: int, seed: int = 0,
         pad: int = 0, max_tokens: int | None = None, tick=None, problems=None,
         reuse: bool = True, max_rows: int | None = None, max_memory: int | None = None,
         uniform_rows: int | None = None) -> tuple[np.ndarray, dict]:
    """(labels, cost) of ``mine_with_lengths`` (see there)."""
    labels, _, cost = mine_with_lengths(pair, cols, answer_of, done_of, greedy, max_new, seed,
                                        pad, max_tokens, tick, problems, reuse, max_rows,
                                        max_memory, uniform_rows)
    return labels, cost


def mine_with_lengths(pair, cols: dict, answer_of, done_of, greedy: bool, max_new: int,
                      seed: int = 0, pad: int = 0, max_tokens: int | None = None, tick=None,
                      problems=None, reuse: bool = True, max_rows: int | None = None,
                      max_memory: int | None = None, uniform_rows: int | None = None
                      ) -> tuple[np.ndarray, np.ndarray, dict]:
    """(labels (N,) int8: 1 critical, 0 harmless, -1 where no label is needed or the
    row is not of ``problems``; extra tokens (N,) int64: how many more tokens the text
    with the draft substituted has than the text without, to the end of the answer or
    the continuation's budget (0 where there is no label, and where both are one text),
    the oracle's length condition (``evolve.rules.oracle``); cost) of a recording's
    columns ``cols`` (``context`` (N, C) the tokens before each drafted row, in the histories' dtype, ``token``,
    ``target_top``, ``target_prob``, ``draft_prob``, ``position``; for reuse also the
    blocks: ``sequence``, ``block_index``, ``block_position``). ``answer_of`` and
    ``done_of`` see the generated text alone: the ``position`` tokens before the row,
    the row's token and what follows (never the prompt); ``done_of`` must hold for every
    longer text once it holds (a text that has ended stays ended). Each continuation
    runs ``max_new`` tokens at most, and with ``max_tokens`` (the decoder's budget of
    generated tokens) no further than that budget: the substituted token and its
    continuation end where the text would.

    ``problems`` (lo, hi): label only the rows whose ``sequence`` is in [lo, hi) (the
    labels are the same bits as the whole split's there). ``reuse``: compute each
    distinct continuation once and none that the recording already holds
    (``label_plan``); False computes both texts of every row. ``max_rows``
    continuations are computed together (default: as many as ``max_memory`` bytes
    hold by the pair's ``mining_row_bytes``, else ``label_plan.DEFAULT_ROWS``). ``uniform_rows``:
    the labelled rows a uniform stream covers (``row_uniforms``; tests only: the
    definition is ``UNIFORM_ROWS``). ``tick(n)``, when given, is called once the ``n``
    labelled rows are done."""
    t0 = time.perf_counter()
    if reuse and greedy and not {"sequence", "block_position"} <= set(cols):
        raise ValueError("reuse in greedy decoding reads the recording's blocks: the columns "
                         "'sequence' and 'block_position' are needed (or reuse=False)")
    need = could_reject(cols, greedy)
    number = np.cumsum(need) - 1                      # each labelled row's number
    take = need.copy()
    if problems is not None:
        seq = np.asarray(cols["sequence"])
        take &= (seq >= problems[0]) & (seq < problems[1])
    rows = np.flatnonzero(take)
    labels = np.full(len(cols["token"]), UNLABELED, dtype=np.int8)
    position = np.asarray(cols["position"])
    limit = np.full(rows.size, max_new, dtype=np.int64)
    if max_tokens is not None:
        limit = np.minimum(max_new, max_tokens - 1 - position[rows])
    u = (None if greedy else row_uniforms(seed, number[rows], max_new + 1,
                                          uniform_rows or UNIFORM_ROWS))
    run = LP.Runner(pair, cols, greedy, done_of, pad, max_rows, max_memory)
    if greedy:
        draws = np.asarray(cols["target_top"])[rows]
    else:                # the target's own draw at each row, from its first uniform
        draws = run.first_tokens(rows, u[:, 0])
    plan = LP.plan(cols, rows, draws, greedy, reuse)
    texts = run.texts(plan, limit, None if u is None else u[:, 1:])
    labels[rows] = [0 if a is None else int(answer_of(a) != answer_of(b)) for a, b in texts]
    extra = np.zeros(labels.size, dtype=np.int64)
    extra[rows] = [0 if a is None else len(a) - len(b) for a, b in texts]
    if tick is not None:
        tick(int(rows.size))
    cost = {"rows": int(rows.size), "critical": int((labels == 1).sum()),
            "target_forward_rows": int(run.passes), "target_forward_passes": int(run.calls),
            "continuations_needed": 2 * int(rows.size),
            "continuations_computed": int(run.computed),
            "seconds": round(time.perf_counter() - t0, 3),
            "continuation": "greedy" if greedy else "seeded sampling", "max_new": max_new}
    return labels, extra, cost


def available_memory() -> int:
    """The machine's available memory in bytes (MemAvailable where Linux says it, else
    the free pages): what mining on the host may take by default is half of it."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def add_costs(costs) -> dict:
    """The cost of mining a split in parts: the counts and seconds added."""
    costs = list(costs)
    out = dict(costs[0]) if costs else {}
    for c in costs[1:]:
        for k, v in c.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "max_new":
                out[k] = out.get(k, 0) + v
    if "seconds" in out:
        out["seconds"] = round(out["seconds"], 3)
    return out


# ------------------------------------------------------------------ the labels' file

def labels_path(directory, split: str) -> Path:
    """Where a split's labels are: ``<split>.labels.npz`` beside its traces."""
    return Path(directory) / f"{split}.labels.npz"


def read_labels(path: Path):
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
            crit = D.read_members(zf, str(path), {COLUMN: f"{COLUMN}.npy"})[COLUMN]
    except DataError:
        raise
    except (zipfile.BadZipFile, KeyError, ValueError, OSError, EOFError) as e:
        raise DataError(f"{path}: cannot read the labels ({first_line(e)})") from None
    return meta, crit


def check_version(meta, where: str, decoding, field: str = "") -> None:
    """DataError unless a labels meta is an object of this ``LABELS_VERSION`` whose
    decoding is the traces' ``decoding`` (``field``: the prefix of the fields' names in
    the message, e.g. a manifest's ``meta.labels.``)."""
    version = meta.get("labels_version") if isinstance(meta, dict) else None
    if type(version) is not int or version != LABELS_VERSION:    # True == 1: not a version
        got = version if isinstance(meta, dict) else meta
        raise DataError(f"{where}: field '{field}labels_version' is {got!r:.40}; expected "
                        f"{LABELS_VERSION}")
    if meta.get("decoding") not in MODES or meta["decoding"] != decoding:
        raise DataError(f"{where}: field '{field}decoding' is {meta.get('decoding')!r:.40}, "
                        f"the traces' decoding {decoding!r:.40}")


def check_critical(columns: dict, crit, greedy: bool, where: str) -> None:
    """The labels of traces' rows (``columns``): int8, one per row, each 1, 0 or
    UNLABELED, a label on every row the standard rule could reject and on no other (a
    label there would still teach the learned judge, which fits every label); DataError
    naming ``where``, the field and the first bad row otherwise."""
    n = len(columns["token"])
    if crit.dtype != np.int8 or crit.shape != (n,):
        raise DataError(f"{where}: field '{COLUMN}' must be int8 of shape ({n},)")
    bad = np.flatnonzero(~np.isin(crit, (UNLABELED, 0, 1)))
    if bad.size:
        raise DataError(f"{where}: field '{COLUMN}' row {int(bad[0])}: "
                        f"{int(crit[bad[0]])} is not -1, 0 or 1")
    needed = could_reject(columns, greedy)
    missing = np.flatnonzero(needed & (crit == UNLABELED))
    if missing.size:
        raise DataError(f"{where}: field '{COLUMN}' row {int(missing[0])}: no label for a "
                        "draft the standard rule could reject")
    extra = np.flatnonzero(~needed & (crit != UNLABELED))
    if extra.size:
        raise DataError(f"{where}: field '{COLUMN}' row {int(extra[0])}: a label for a "
                        f"draft the standard rule never rejects (expected {UNLABELED}; "
                        f"{extra.size} such rows)")


def load_labels(path: Path, traces_path: Path, ts):
    """(meta, critical) of the labels file ``path`` of the traces ``ts`` read from
    ``traces_path``, checked: the version and decoding (a meta without one takes the
    traces'), the traces' checksum, and every label (``check_critical``)."""
    if not os.path.isfile(path):
        raise DataError(f"{path}: the labels of {Path(traces_path).name} are missing "
                        "(`evolve data task` writes both)")
    meta, crit = read_labels(path)
    meta.setdefault("decoding", ts.meta.get("decoding"))
    check_version(meta, str(path), ts.meta.get("decoding"))
    if meta.get("traces_sha256") != sha256_file(traces_path):
        raise DataError(f"{path}: field 'traces_sha256' does not match "
                        f"{Path(traces_path).name}: the labels are of other traces (record "
                        "both again)")
    check_critical(ts.columns, crit, ts.meta["decoding"] == "greedy", str(path))
    return meta, crit
