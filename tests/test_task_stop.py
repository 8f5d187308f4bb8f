"""Stop strings of a task (evolve.data.sources.task.checker.cut_at_stop, the pairs'
``body`` and ``done_of``, the decoders' ``done_of``): a generated text ends where the
first stop string starts, in recording, mining and free-running decoding alike, and
the stop strings are recorded with the traces so a rebuilt pair decodes the same. On
the built-in task with the stop string "6.": texts with a step whose result ends with
6 end there, without an answer."""

from __future__ import annotations

import numpy as np
import pytest

from evolve.freerun import task_compare as TC
from evolve.data import label_plan as LP
from evolve.data import labels as LB
from evolve.data.sources.task import greedy as GR
from evolve.data.sources.task import pair as TP
from evolve.data.sources.task import record
from evolve.data.sources.task.checker import cut_at_stop, stop_problem
from evolve.data.sources.ngram import TraceConfigError
from tests import naive_labels
from tests.clikit import invoke, one_line_error

STOP = "6."


@pytest.fixture(scope="module")
def pair():
    return TP.build_pair(TP.TaskPairConfig(train_prompts=60, valid_prompts=24, test_prompts=24,
                                           stop=(STOP,)))


def test_a_text_is_cut_where_the_first_stop_string_starts():
    assert cut_at_stop("a b. Q: c Q: d", ("Q:",)) == "a b. "
    assert cut_at_stop("xyz then abc", ("abc", "then")) == "xyz "
    assert cut_at_stop("nothing here", ("Q:",)) == "nothing here"
    assert cut_at_stop("Q: at once", ("Q:",)) == ""
    assert stop_problem(["Q:", "\n\n"]) == ""
    for bad in ("Q:", [""], ["x" * 201], [1], ["a"] * 17):
        assert stop_problem(bad)
    with pytest.raises(TraceConfigError, match="stop"):
        TP.TaskPairConfig(stop=("",)).validate()


def test_recording_mining_and_free_running_end_at_the_stop_string(pair):
    """Greedy: every recorded text ends in the block where it first holds a stop string
    (or its end), texts with a result ending with 6 have no answer, the labels are the
    first miner's with the same pair, free-running counts the tokens up to the stop
    string, and the pair rebuilt from the traces' meta has the stop string. Planted,
    each fails it: the decoder not ending texts at a stop string, the body not cut at
    it, free-running counting tokens to the end byte."""
    ts = record.record_traces(pair, "valid", "greedy", 6)
    cols = ts.columns
    seq = cols["sequence"]
    stopped = 0
    for s in range(6):
        lo, hi = np.searchsorted(seq, [s, s + 1])
        text = LP.recorded_text(cols, lo, hi, 4)
        last = int(cols["position"][hi - 4])            # the last block's start
        assert not pair.done_of(text[:last]), s
        answer = pair.answer_of(text)
        if pair.done_of(text) and pair.end not in text:    # stopped by the string
            stopped += 1
            assert answer is None and STOP in bytes(text).decode("latin-1")
    assert 0 < stopped < 6
    want, _, _, _ = naive_labels.mine(pair, cols, pair.answer_of, pair.done_of, True,
                                      pair.max_new("valid"), 0, pad=pair.pad)
    got, _ = LB.mine(pair, cols, pair.answer_of, pair.done_of, True, pair.max_new("valid"),
                     0, pad=pair.pad)
    assert np.array_equal(got, want) and (got == 1).any()
    raw = TC.run_rule(pair, None, "valid", 6, greedy=True)
    plain = TP.build_pair(TP.TaskPairConfig(train_prompts=60, valid_prompts=24,
                                            test_prompts=24))
    free = TC.run_rule(plain, None, "valid", 6, greedy=True)
    H, _ = TP.prompts_of(plain, "valid", 6)          # lossless greedy: the target's text
    texts, _ = GR.generate(plain.target, H, pair.max_new("valid"))
    cut = np.array([STOP in t.decode("latin-1") for t in texts])
    assert cut.sum() == stopped
    upto = np.array([t.decode("latin-1").find(STOP) + len(STOP) for t in texts])
    assert np.array_equal(raw["tokens"][cut], upto[cut])
    assert all(a is None for a in np.array(raw["answers"], dtype=object)[cut])
    assert np.array_equal(raw["tokens"][~cut], free["tokens"][~cut])
    assert TP.rebuild(ts.meta).config.stop == (STOP,)
    assert ts.meta["task"]["stop"] == [STOP]


def test_the_command_line_takes_stop_strings(tmp_path):
    r = invoke("data", "task", "--out", tmp_path / "a", "--train-prompts", 3,
               "--valid-prompts", 2, "--test-prompts", 2, "--stop", STOP)
    assert r.exit_code == 0, r.output
    one_line_error(invoke("data", "task", "--out", tmp_path / "b", "--stop", ""), "--stop",
                   "non-empty")
