"""The rules table: the generated baselines module, seeds, families and leniency.

Also guarantee 23 of docs/reliability.md, Simulations within their bounds
(test_every_parameter_lies_in_its_stated_range_and_outside_it_is_refused): see
tests/test_hostile_cli.py.
"""

import numpy as np

from evolve.lang import numpy_eval, treeio
from evolve.objectives.base import TOKENS, TRACES
from evolve.rules import source
from evolve.rules.table import RULES, engine_families, families, rules, seed_trees
from evolve.io.paths import HEURISTICS_DIR


def test_committed_baselines_module_is_generated_from_the_table():
    assert (HEURISTICS_DIR / "baselines.py").read_text() == source.module_text()


def test_every_rule_parses_at_every_grid_value():
    for r in RULES.values():
        for v in (r.grid or (None,)):
            treeio.parse(r.tree(v))


def test_token_rules_read_only_the_six_features_and_seeds_exist():
    assert "ears" not in {r.name for r in rules(TOKENS)}
    assert {r.name for r in rules(TRACES)} == set(RULES)
    assert len(seed_trees(TRACES)) == len(seed_trees(TOKENS)) + 3
    assert set(families()) == {"standard_rejection", "leniency", "ears", "typical_acceptance",
                               "bild_rollback", "hf_ensemble", "sglang_acc", "sglang_single",
                               "cactus", "fuzzy_sd"}
    assert {"cactus", "fuzzy_sd"}.isdisjoint(r.name for r in rules(TOKENS))   # slot features
    # the target-only (SGLang) families exist only on traces, the ensemble weight on both
    assert {"sglang_acc", "sglang_single"}.isdisjoint(r.name for r in rules(TOKENS))
    assert "hf_ensemble" in {r.name for r in rules(TOKENS)}


def test_engine_families_carry_their_engine_settings():
    assert set(engine_families()) == {"hf_ensemble", "sglang_acc", "sglang_single"}
    assert RULES["hf_ensemble"].engine_setting(0.85) == "assistant_ensemble_weight=0.85"
    assert RULES["sglang_acc"].engine_setting(0.6) == (
        "--speculative-accept-threshold-single 1 --speculative-accept-threshold-acc 0.6")
    assert RULES["sglang_single"].engine_setting(0.9) == (
        "--speculative-accept-threshold-single 0.9 --speculative-accept-threshold-acc 1")
    assert RULES["leniency"].engine_setting(0.5) is None
    # the engines' defaults are their lossless settings
    assert all(RULES[n].default == 1.0 for n in engine_families())


def test_lenient_rules_accept_at_least_as_often_as_the_standard_rule():
    rng = np.random.default_rng(0)
    n = 5000
    F = {"draft_prob": rng.uniform(1e-3, 1, n), "target_prob": rng.uniform(1e-3, 1, n),
         "position": rng.integers(0, 100, n).astype(float),
         "draft_entropy": rng.uniform(0, 6, n), "target_entropy": rng.uniform(0, 6, n),
         "top_token_match": rng.random(n) < 0.5, "block_position": rng.integers(0, 4, n),
         "p_max": rng.uniform(0.3, 1, n), "q_max": rng.uniform(0.3, 1, n),
         "slot_tv": rng.uniform(0, 1, n), "slot_kl_pq": rng.exponential(0.5, n),
         "slot_kl_qp": rng.exponential(0.5, n)}
    std = np.minimum(1.0, F["target_prob"] / F["draft_prob"])
    for r in RULES.values():
        # a greedy-only family is lenient against greedy lossless decoding, which keeps
        # the target's argmax drafts (whatever the rule) and no other: any rule is
        if not r.lenient or "sample" not in r.decodings:
            continue
        for v in (r.grid or (None,)):
            h = np.clip(numpy_eval.evaluate(treeio.parse(r.tree(v)), F), 0, 1)
            assert (h >= std - 1e-15).all(), (r.name, v)


def test_every_parameter_lies_in_its_stated_range_and_outside_it_is_refused():
    """Each rule's default and grid lie in the table's range for its parameter, and
    ``named_rule`` refuses values outside it (ears:-1, ears:-1e308 and cactus:-1 used
    to be accepted) in one line stating the range."""
    import math

    import pytest

    from evolve.rules.adapters import RuleError, named_rule
    taking = [r for r in RULES.values() if r.param is not None]
    assert len(taking) >= 9
    for r in taking:
        assert r.default in r.range and all(v in r.range for v in r.grid), r.name
        named_rule(r.name, r.default)
        rng = r.range
        outside = [rng.low - 1.0, -1e308, math.nan, math.inf, -math.inf]
        outside += [rng.low] if rng.low_open else []
        outside += [rng.high + 1.0, 1e308] if rng.high < math.inf else []
        for v in outside:
            with pytest.raises(RuleError) as e:
                named_rule(r.name, v)
            assert e.value.field == "param" and "\n" not in str(e.value), (r.name, v)
            if math.isfinite(v):
                assert rng.text(r.param) in str(e.value), str(e.value)
    assert RULES["leniency"].range.text("l") == "0 < l <= 1"
    assert RULES["ears"].range.text("beta") == "beta >= 0"
