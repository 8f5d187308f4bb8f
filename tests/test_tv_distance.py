"""Where a rule puts its distortion: the trade-off's mean slot TV on test by distance
from the prompt (``spec.tv_by_distance``), against a block-by-block reference, and in
``evolve tradeoff``'s table and JSON."""

from __future__ import annotations

import json

import numpy as np
import pytest

from evolve.data import traces as T
from evolve.data.distance import DISTANCE_BINS, bin_label
from evolve.lang import treeio
from evolve.objectives import spec
from evolve.rules.tuning import tree_thresholds
from tests.clikit import invoke
from tests.tracekit import tiny_dir_fixture

tiny_dir = tiny_dir_fixture()
LENIENT = "pmin(1.0, pdiv(target_prob, mul(0.3, draft_prob)))"


def test_tv_by_distance_is_the_reach_weighted_mean_of_each_bin(tiny_dir):
    ts = T.load(tiny_dir / "test.npz")
    sa = spec.TraceArrays.from_split(ts)
    h = tree_thresholds(treeio.parse(LENIENT), sa)
    got = spec.tv_by_distance(sa, h)
    terms = spec.position_terms(sa, h)
    distance = np.asarray(ts.columns["position"])
    sums = {bin_label(lo, hi): [0.0, 0.0, 0] for lo, hi in DISTANCE_BINS}
    for b in range(sa.n_blocks):              # reach: the product of earlier acceptances
        reach = 1.0
        for k in range(sa.g):
            i = b * sa.g + k
            key = next(bin_label(lo, hi) for lo, hi in DISTANCE_BINS
                       if distance[i] >= lo and (hi is None or distance[i] <= hi))
            sums[key][0] += reach * terms.tv[i]
            sums[key][1] += reach
            sums[key][2] += 1
            reach *= terms.a_x[i]
    assert list(got) == list(sums)
    for key, (tv, w, n) in sums.items():
        assert got[key]["slots"] == n
        assert got[key]["tv"] == (None if w == 0 else pytest.approx(tv / w))
    whole = spec.objectives(sa, h)              # the bins add up to the split's TV
    total = sum(v["tv"] * sums[k][1] for k, v in got.items() if v["tv"] is not None)
    assert total / (whole.tokens_per_call * sa.n_blocks) == pytest.approx(whole.tv_per_token)
    assert got["0"]["slots"] > 0 and any(v["tv"] for v in got.values())


def test_the_tradeoff_reports_it_for_every_tuned_rule(tiny_dir):
    doc = json.loads(invoke("tradeoff", "--data", tiny_dir, "--budget", 0.02, "--json").stdout)
    rows = [r for r in doc["budgets"][0]["rows"] if r["test"] is not None]
    leniency = next(r for r in rows if r["rule"] == "leniency")
    by = leniency["test"]["tv_by_distance"]
    assert list(by) == [bin_label(lo, hi) for lo, hi in DISTANCE_BINS]
    text = invoke("tradeoff", "--data", tiny_dir, "--budget", 0.02)
    assert text.exit_code == 0, text.output
    assert "by distance from the prompt" in text.output
