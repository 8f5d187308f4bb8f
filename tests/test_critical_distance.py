"""Where a task rule changes answers: accepted critical tokens per answer and the
critical share of the labelled drafts, by distance from the prompt, on the recorded
path (``task_labels.critical_by_distance``), against a slot-by-slot reference."""

from __future__ import annotations

import json

import numpy as np
import pytest

from evolve.data.distance import DISTANCE_BINS, bin_label
from evolve.data.sources.task import record
from evolve.kernels.tokens import matrix_thresholds
from evolve.lang import treeio
from evolve.objectives import task_labels as TL
from evolve.objectives.task_data import TaskData, metrics_of
from tests.clikit import invoke

RULE = "pmin(1.0, pdiv(target_prob, mul(0.5, draft_prob)))"


def _reference(td: TaskData, h) -> dict:
    """Block after block, slot after slot: reach, the rule's extra acceptance of a
    critical draft, added to its distance's bin."""
    ta, g = td.arrays, td.g
    a = TL.acceptance(np.atleast_2d(h), ta)[0]
    per = {bin_label(lo, hi): [0, 0, 0.0] for lo, hi in DISTANCE_BINS}

    def key(d):
        return next(bin_label(lo, hi) for lo, hi in DISTANCE_BINS
                    if d >= lo and (hi is None or d <= hi))
    for b in range(ta.n_blocks):
        reach = 1.0
        for k in range(g):
            i = b * g + k
            rec = per[key(int(td.distance[i]))]
            if ta.s[i] < 1.0 and ta.critical[i] != TL.UNLABELED:
                rec[0] += 1
                rec[1] += int(ta.critical[i] == 1)
            if ta.critical[i] == 1:
                rec[2] += reach * max(a[i] - ta.s[i], 0.0)
            reach *= a[i]
    return {k: (n, c / n if n else None, x / ta.answers) for k, (n, c, x) in per.items()}


def test_by_distance_matches_the_slot_by_slot_reference_and_adds_up(task_greedy_small):
    td = TaskData(record.load(task_greedy_small, "train"))
    progs = treeio.linearise([treeio.parse(RULE)])
    h = matrix_thresholds(progs, td.X)[0]
    got = td.critical_by_distance(h)
    want = _reference(td, h)
    assert list(got) == list(want)
    for k, (n, rate, per_answer) in want.items():
        assert got[k]["labelled"] == n
        assert got[k]["critical_rate"] == (None if rate is None else pytest.approx(rate))
        assert got[k]["critical_per_answer"] == pytest.approx(per_answer, abs=1e-12)
    assert sum(v["labelled"] for v in got.values()) > 0
    total = metrics_of(td.sums(progs))["critical_per_answer"]
    assert sum(v["critical_per_answer"] for v in got.values()) == pytest.approx(total)
    assert total > 0          # the rule accepts critical drafts here: the bins are not all 0


def test_a_task_run_reports_it_for_its_champion(task_greedy_small, tmp_path):
    r = invoke("run", "--objective", "task_speed", "--data", task_greedy_small,
               "--generations", 1, "--population", 12, "--seed", 2, "--select-problems", 0,
               "--runs-dir", tmp_path, "--name", "dist")
    assert r.exit_code == 0, r.output
    ch = json.loads((tmp_path / "dist" / "champion.json").read_text())
    for split in ("train", "valid", "test"):
        by = ch["metrics"][split]["critical_by_distance"]
        assert list(by) == [bin_label(lo, hi) for lo, hi in DISTANCE_BINS]
        assert sum(v["critical_per_answer"] for v in by.values()) == pytest.approx(
            ch["metrics"][split]["critical_per_answer"])
    assert "by distance from the prompt on test" in " ".join(r.output.split())
