"""Label mining sized to the machine (evolve/data/labels.py, label_plan.py,
evolve/data/sources/task/mining.py, evolve/cluster/mining.py): on the built-in task,
greedy and sampled, the labels are the first miner's (tests/naive_labels.py) bit for
bit with and without reuse, under every batch size, memory bound and uniform stream,
mined whole, in parts, sharded, resumed after an interruption and on a Dask cluster;
reuse computes fewer target rows; the command line's refusals are one line."""

from __future__ import annotations

import numpy as np
import pytest

from evolve.data import labels as LB
from evolve.data import traces as T
from evolve.data.sources.task import mining, record
from tests import naive_labels
from tests.clikit import invoke, one_line_error

PROBLEMS = {"greedy": 6, "sample": 2}
STREAM = 16          # labelled rows a uniform stream covers here (2048 in the definition)


@pytest.fixture(scope="module")
def pair(task_pair_small):
    return task_pair_small


@pytest.fixture(scope="module")
def references(pair):
    """mode -> (mode, traces, the first miner's labels and target rows read) of a few
    valid problems, each recorded and mined once, when first asked for."""
    out = {}

    def get(mode):
        if mode not in out:
            ts = record.record_traces(pair, "valid", mode, PROBLEMS[mode])
            labels, rows, _, texts = naive_labels.mine(
                pair, ts.columns, pair.answer_of, pair.done_of, mode == "greedy",
                pair.max_new("valid"), 0, pad=pair.pad, batch=STREAM)
            out[mode] = (mode, ts, labels, rows, texts)
        return out[mode]
    return get


def _mine(pair, ts, mode, **kw):
    return LB.mine(pair, ts.columns, pair.answer_of, pair.done_of, mode == "greedy",
                   pair.max_new("valid"), 0, pad=pair.pad, uniform_rows=STREAM, **kw)


HOW = {"reuse": dict(), "reuse-3-rows": dict(max_rows=3),
       "no-reuse-5-rows": dict(reuse=False, max_rows=5), "1MiB": dict(max_memory=2 ** 20)}


CASES = [("greedy", how) for how in HOW] + [("sample", "reuse"), ("sample", "no-reuse-5-rows")]


@pytest.mark.parametrize("mode, how", CASES)
def test_labels_are_the_first_miners_bit_for_bit(pair, references, mode, how):
    """Planted, each fails it: the end chain's history without the last draft, own_m's
    recorded text one token late, a sampled row whose own draw is its draft labelled
    1."""
    _, ts, want, rows, _ = references(mode)
    how = HOW[how]
    labels, cost = _mine(pair, ts, mode, **how)
    assert np.array_equal(labels, want)
    assert cost["rows"] == int((want >= 0).sum()) and cost["critical"] == int((want == 1).sum())
    assert 0 < cost["critical"] < cost["rows"]
    if how.get("reuse", True):
        assert cost["target_forward_rows"] < rows
        assert cost["continuations_computed"] < cost["continuations_needed"]
    else:
        assert cost["target_forward_rows"] <= rows
    if mode == "greedy" and how.get("reuse", True):      # about half the rows
        assert cost["target_forward_rows"] < 0.6 * rows


@pytest.mark.parametrize("mode", ["greedy", "sample"])
def test_every_text_is_the_first_miners(pair, references, mode):
    """Not only the labels: both texts of every labelled row, token for token, as the
    plan walks and continues them (a sampled row whose own draw is its draft has one
    text, the first miner's two being equal). Planted, each fails it: the sub text's
    known tokens without the next rejectable row's argmax (the labels stay the same),
    a chain's tokens one short."""
    from evolve.data import label_plan as LP
    _, ts, _, _, want = references(mode)
    cols, greedy = ts.columns, mode == "greedy"
    rows = np.flatnonzero(LB.could_reject(cols, greedy))
    u = LB.row_uniforms(0, np.arange(rows.size), pair.max_new("valid") + 1, STREAM)
    run = LP.Runner(pair, cols, greedy, pair.done_of, pair.pad)
    draws = cols["target_top"][rows] if greedy else run.first_tokens(rows, u[:, 0])
    got = run.texts(LP.plan(cols, rows, draws, greedy, True),
                    np.full(rows.size, pair.max_new("valid")), u[:, 1:])
    assert len(got) == len(want)
    for (a, b), (x, y) in zip(got, want):
        assert (a, b) == (x, y) or (a is b is None and x == y)
    assert greedy or any(a is None for a, _ in got)


@pytest.mark.parametrize("mode", ["greedy", "sample"])
def test_extra_tokens_are_the_first_miners_text_lengths(pair, references, mode):
    """``mine_with_lengths``: the same labels as ``mine``, and each labelled row's extra
    tokens are the length of the first miner's sub text minus its own (0 on every other
    row); some drafts lengthen the text and some shorten it. Planted, each fails it:
    own minus sub, the lengths of the rows shifted by one."""
    _, ts, want, _, texts = references(mode)
    labels, extra, _ = LB.mine_with_lengths(
        pair, ts.columns, pair.answer_of, pair.done_of, mode == "greedy",
        pair.max_new("valid"), 0, pad=pair.pad, uniform_rows=STREAM)
    assert np.array_equal(labels, want)
    rows = np.flatnonzero(want >= 0)
    assert np.array_equal(extra[rows], [len(a) - len(b) for a, b in texts])
    assert not extra[want < 0].any()
    if mode == "greedy":
        assert (extra > 0).any() and (extra < 0).any()


def test_a_memory_bound_sizes_the_batches(pair):
    """The built-in pair's bound: fewer bytes, more batched calls of the target (the
    labels do not change: the test above)."""
    ts = record.record_traces(pair, "valid", "greedy", 2)
    per = pair.mining_row_bytes(ts.columns["context"].shape[1], pair.max_new("valid"))
    runs = {m: _mine(pair, ts, "greedy", max_memory=m * per)[1] for m in (1, 4, 10 ** 6)}
    calls = [runs[m]["target_forward_passes"] for m in (1, 4, 10 ** 6)]
    assert calls[0] > calls[1] > calls[2]
    assert len({runs[m]["target_forward_rows"] for m in runs}) == 1


def test_uniforms_of_a_row_are_those_of_its_stream_whatever_is_drawn_with_it():
    index = np.array([0, 5, 6, 7, 13, 20, 2047, 2048, 5000])
    got = LB.row_uniforms(3, index, 11, per=7)
    for row, i in zip(got, index):
        s = i - i % 7
        want = np.random.default_rng((3, int(s))).random((7, 11))[i - s]
        assert np.array_equal(row, want)
    assert np.array_equal(LB.row_uniforms(3, index[::-1], 11, per=7), got[::-1])


def _save(ts, d):
    d.mkdir()
    T.save(ts, d / "valid.npz")
    return d


def _labels(d):
    return LB.read_labels(LB.labels_path(d, "valid"))[1]


@pytest.mark.parametrize("mode", ["greedy", "sample"])
def test_parts_shards_and_a_resume_give_the_whole_split_s_labels(pair, references, mode,
                                                                  tmp_path, monkeypatch):
    """Parts of one problem each (uniform streams of 16 labelled rows, so parts and
    streams cut each other): by 3 shards (labels written by the last), and interrupted
    after a part then resumed, the first miner's bits, and the resume mines only the
    parts left. Planted, each fails it: a resume that mines every part again, a part's
    labels assembled in the wrong order. (Rows numbered from a part's start: these
    labels happen not to change; tests/test_labels.py catches it.)"""
    _, ts, want, _, _ = references(mode)
    monkeypatch.setattr(mining, "CHUNK", 1)
    monkeypatch.setattr(LB, "UNIFORM_ROWS", STREAM)
    sharded = _save(ts, tmp_path / "sharded")
    miner = mining.Miner(pair, sharded / "valid.npz")
    for i in range(3):
        done = mining.mine_split(sharded, miner, shard=(i, 3))
        assert (done is None) == (i < 2)
    assert np.array_equal(_labels(sharded), want)
    assert not mining.parts_dir(sharded, "valid").exists()

    stopped = _save(ts, tmp_path / "stopped")
    calls = []
    real = mining.Miner.mine

    def once(self, part, tick=None):
        if calls:
            raise KeyboardInterrupt
        calls.append(part)
        return real(self, part, tick)
    monkeypatch.setattr(mining.Miner, "mine", once)
    miner = mining.Miner(pair, stopped / "valid.npz")
    with pytest.raises(KeyboardInterrupt):
        mining.mine_split(stopped, miner)
    assert len(mining.done_parts(stopped, miner)) == 1
    monkeypatch.setattr(mining.Miner, "mine", lambda self, part, tick=None: (
        calls.append(part), real(self, part, tick))[1])
    meta = mining.mine_split(stopped, mining.Miner(pair, stopped / "valid.npz"))
    assert np.array_equal(_labels(stopped), want) and meta["mined"]["rows"] == (want >= 0).sum()
    assert len(calls) == PROBLEMS[mode] and len(set(calls)) == len(calls)


def test_a_part_of_other_traces_is_refused_in_one_line(pair, tmp_path, monkeypatch):
    monkeypatch.setattr(mining, "CHUNK", 1)
    a = _save(record.record_traces(pair, "valid", "greedy", 3), tmp_path / "a")
    mining.mine_split(a, mining.Miner(pair, a / "valid.npz"), shard=(0, 3))
    other = _save(record.record_traces(pair, "test", "greedy", 3), tmp_path / "other")
    mining.parts_dir(a, "valid").rename(mining.parts_dir(other, "valid"))
    with pytest.raises(LB.DataError, match="0-1.npz: field 'traces_sha256'.*--force"):
        mining.mine_split(other, mining.Miner(pair, other / "valid.npz"))


def test_parsing_of_shards_and_sizes():
    assert mining.parse_shard("1/4") == (1, 4)
    for bad in ("4/4", "1", "a/2", "-1/2", "1/0"):
        with pytest.raises(ValueError):
            mining.parse_shard(bad)
    assert mining.parse_memory("40GB") == 40 * 10 ** 9
    assert mining.parse_memory("512MiB") == 512 * 2 ** 20
    assert mining.parse_memory("2.5e9") == 2_500_000_000
    for bad in ("12", "lots", "5XB", "2000TB"):
        with pytest.raises(ValueError):
            mining.parse_memory(bad)


SMALL = ("--train-prompts", 3, "--valid-prompts", 2, "--test-prompts", 2)


@pytest.fixture(scope="module")
def whole(tmp_path_factory):
    """``evolve data task`` of SMALL in one process, mined whole."""
    a = tmp_path_factory.mktemp("whole") / "task"
    r = invoke("data", "task", "--out", a, *SMALL, "--max-memory", "64MB")
    assert r.exit_code == 0, r.output
    return a


def _same_files(a, b):
    for s in ("train", "valid", "test"):
        assert (a / f"{s}.npz").read_bytes() == (b / f"{s}.npz").read_bytes()
        assert np.array_equal(LB.read_labels(LB.labels_path(a, s))[1],
                              LB.read_labels(LB.labels_path(b, s))[1])


def test_the_command_line_resumes_and_refuses_in_one_line(whole, tmp_path, monkeypatch):
    """The help offers the memory bound, resume, shards, a cluster and stop strings;
    --shard 0/2 and 1/2 (parts of 2 problems) give the files of a whole recording;
    --resume then finds everything mined; --resume with other settings, a bad --shard or
    --max-memory, --force with --resume, and existing files without either are one
    line each."""
    monkeypatch.setattr(mining, "CHUNK", 2)
    a, b = whole, tmp_path / "b"
    r = invoke("data", "task", "--help")
    assert all(o in r.output for o in ("--max-memory", "--resume", "--shard", "--cluster",
                                       "--stop"))
    for i in range(2):
        r = invoke("data", "task", "--out", b, *SMALL, "--shard", f"{i}/2")
        assert r.exit_code == 0, r.output
        assert ("still to mine" in r.output) == (i == 0)
    _same_files(a, b)
    r = invoke("data", "task", "--out", b, *SMALL, "--resume")
    assert r.exit_code == 0 and "already mined" in r.output, r.output
    one_line_error(invoke("data", "task", "--out", a, *SMALL[:-1], 3, "--resume"),
                   "--resume", "train.npz", "other settings", "test_prompts", "--force")
    one_line_error(invoke("data", "task", "--out", a, *SMALL), "--out", "exists", "--force",
                   "--resume")
    one_line_error(invoke("data", "task", "--out", a, "--shard", "2/2"), "--shard", "2/2",
                   "0 <= I < N")
    one_line_error(invoke("data", "task", "--out", a, "--max-memory", "lots"),
                   "--max-memory", "40GB")
    one_line_error(invoke("data", "task", "--out", a, "--force", "--resume"), "--force",
                   "--resume")


def test_npy_headers_are_parsed_one_at_a_time(whole, monkeypatch):
    """NumPy parses a .npy header with ast.literal_eval, which on CPython 3.11 can fail
    when two threads parse at once (threaded Dask workers reading splits; see
    evolve.data.tokens.read_npy_header): every header of a split is read holding the
    one lock."""
    from evolve.data import tokens
    held = []
    for name in ("read_array_header_1_0", "read_array_header_2_0"):
        real = getattr(np.lib.format, name)

        def spy(*args, _real=real, **kwargs):
            held.append(tokens._HEADER_LOCK.locked())
            return _real(*args, **kwargs)
        monkeypatch.setattr(np.lib.format, name, spy)
    T.load(whole / "train.npz")
    assert len(held) >= 10 and all(held)


def test_mining_on_a_dask_cluster_gives_the_same_labels(whole, tmp_path, monkeypatch):
    """Parts of 2 problems on two Dask workers (threads of this process here, so the
    test starts in a second; ``--cluster local:N`` starts processes): the files of a
    whole recording."""
    distributed = pytest.importorskip("distributed")
    monkeypatch.setattr(mining, "CHUNK", 2)
    b = tmp_path / "b"
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                  protocol="tcp", dashboard_address=":0") as cluster:
        r = invoke("data", "task", "--out", b, *SMALL, "--scheduler",
                   cluster.scheduler_address)
    assert r.exit_code == 0, r.output
    _same_files(whole, b)
