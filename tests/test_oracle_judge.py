"""The oracle-judge study (benchmarks/experiments/oracle_judge.py) runs end to end at tiny
sizes: its labels add up, a judge at λ 0 decodes as lossless, the token class enters
one-hot, and the page's tables come from the figures."""

from types import SimpleNamespace

import numpy as np
import pytest

from benchmarks.experiments import oracle_judge as OJ
from evolve.rules import judge


def _args(**kw):
    return SimpleNamespace(**{**dict(seeds=[0], train=40, valid=12, test=8, budget=0.01,
                                     grid=(0.0, 0.3, 0.6), data=None, out=OJ.OUT,
                                     section=OJ.SECTION), **kw})


@pytest.fixture(scope="module")
def doc(task_greedy_small):
    """The study on a greedy recording (its train labels mined again with lengths must
    be the recorded ones, or it stops)."""
    return OJ.run(_args(data=[task_greedy_small], valid=12, test=30))


def test_a_seed_of_the_built_in_task_is_labelled_and_decoded():
    d = OJ.run(_args(seeds=[1], train=24, valid=6, test=4, grid=(0.0, 0.5)))
    s = d["seeds"][0]
    assert s["seed"] == 1 and s["train_problems"] == 24 and s["test"]["problems"] == 4
    assert s["train_critical"] + s["train_oracle_keeps"] + s["train_longer"] \
        == s["train_labelled"] > 0
    assert "--seeds 1 --train 24" in d["command"] and "--data" not in d["command"]


def test_the_labels_add_up_and_the_oracle_saves(doc, task_greedy_small):
    s = doc["seeds"][0]
    assert s["train_critical"] + s["train_oracle_keeps"] + s["train_longer"] \
        == s["train_labelled"] > 0
    assert 0 < s["train_oracle_keeps"] < s["train_labelled"] - s["train_critical"]
    assert s["train_problems"] == 60 and (s["valid_problems"], s["test_problems"]) == (12, 24)
    res = s["test"]
    assert res["reference"] == "lossless" and res["problems"] == 24
    assert f"--data {task_greedy_small}" in doc["command"]
    assert res["versus_reference"]["oracle"]["calls_per_correct"]["difference"] < 0
    assert set(s["tuned"]) == {f"{lb} labels, {i} inputs" for lb in OJ.LABELS
                               for i in OJ.INPUT_SETS}
    assert "token_class" in s["inputs"]["all"] and len(s["inputs"]["all"]) > 12


def test_a_judge_at_lambda_0_is_lossless(doc):
    """A judge at λ 0 keeps nothing the lossless rule would reject: no accuracy lost on
    valid, and a judge tuned to it decodes test as lossless (same calls, same answers)."""
    s = doc["seeds"][0]
    for name, t in s["tuned"].items():
        zero = [x for x in t["tried"] if x[0] == 0.0]
        assert zero and zero[0][2] == 0.0, name          # no accuracy lost on valid
        if t["lambda"] == 0.0:
            v = s["test"]["versus_reference"][name]
            assert v["calls_per_problem"]["difference"] == 0.0
            assert v["accuracy"]["difference"] == 0.0


def test_the_token_class_is_one_hot_and_thresholds_follow_lambda():
    d = judge.Design(["draft_prob", "token_class"], classes=[0.0, 2.0])
    F = {"draft_prob": np.array([0.1, 0.2, 0.3]), "token_class": np.array([2.0, 0.0, 1.0])}
    assert d.matrix(F.get).tolist() == [[0.1, 0.0, 1.0], [0.2, 1.0, 0.0], [0.3, 0.0, 0.0]]

    class Fixed:
        def probability(self, X):
            return np.array([0.1, 0.5, 0.9])
    rule = judge.rule(Fixed(), 0.5, True, d)
    assert rule.many(F).tolist() == [1.0, 0.0, 0.0]


def test_the_page_shows_every_judge_per_seed(doc):
    text = OJ.markdown(doc)
    for name in doc["seeds"][0]["tuned"]:
        assert f"| {name} | " in text
    assert "| oracle | " in text and doc["command"] in text
    assert "The greedy recording" in text and "24 test problems" in text


def test_a_sampled_recording_is_refused_in_one_line(tmp_path, task_pair_small):
    from evolve.data.sources.task import record
    record.save(record.record_split(task_pair_small, "train", "sample", 0, prompts=3), tmp_path)
    with pytest.raises(SystemExit, match=r"a sample recording; the study decodes greedy "
                                         r"recordings only"):
        OJ.one_recording(tmp_path, _args())


def test_labels_that_are_not_the_recorded_ones_stop_it(tmp_path, task_greedy_small):
    """The study labels train again with lengths; a recording whose labels are not what
    that gives (here one harmless label flipped) is refused, not studied."""
    import shutil
    from evolve.data import labels as LB
    from evolve.data import tokens as D
    d = tmp_path / "rec"
    shutil.copytree(task_greedy_small, d)
    meta, crit = LB.read_labels(LB.labels_path(d, "train"))
    crit = crit.copy()
    crit[np.flatnonzero(crit == 0)[0]] = 1
    D.write_npz(LB.labels_path(d, "train"), meta, {f"{LB.COLUMN}.npy": crit})
    with pytest.raises(SystemExit, match="differ from the recorded ones"):
        OJ.one_recording(d, _args())
