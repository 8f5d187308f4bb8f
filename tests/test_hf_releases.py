"""The ``--format hf`` drop-in across transformers releases.

transformers' ``_speculative_sampling`` is private and its parameters changed twice:
4.56 to 5.16 pass ``is_done_candidate``, 5.17 adds ``assistant_ensemble_weight`` as a
keyword, and later releases drop ``is_done_candidate``. ``install()`` reads the
signature it replaces and installs an adapter with exactly those parameters.

The fast tests call the installed drop-in as each release's ``_assisted_decoding``
calls it. The slow one installs the oldest release pyproject allows (4.56) and 5.17
beside the test environment (``pip install --target``, first on ``PYTHONPATH``) and
runs the drop-in's tests inside ``generate`` of ``tests/test_export.py`` and
``tests/test_faithful.py`` (every drafted position's distributions and decisions, a
lenient rule's acceptance; the distribution test of many generations runs once, under
the newest release) and the KV-cached decoder's tests (``tests/test_hf_cache.py``: cached reads equal an uncached forward,
whole recordings) under each; the newest release is the test environment's own.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from evolve.export import modules
from evolve.lang import treeio
from evolve.rules.table import RULES
from tests.genload import load_module_from

torch = pytest.importorskip("torch")
gu = pytest.importorskip("transformers.generation.utils")

ROOT = Path(__file__).resolve().parents[1]
RELEASES = ("4.56.2", "5.17.0")        # the oldest allowed by pyproject, and 5.17
VOCAB = 8


def _dropin(tmp_path, rule="standard_rejection"):
    src = modules.export_source(treeio.parse(RULES[rule].tree()), "hf", {"metrics": {}}, rule)
    path = tmp_path / f"{rule}_hf.py"
    path.write_text(src)
    return load_module_from(path, f"_hf_release_{rule}_{abs(hash(str(tmp_path)))}")


def _inputs(g=4, seed=0):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (1, 3 + g), generator=gen)
    q_logits = torch.randn(1, g, VOCAB, generator=gen)
    p_logits = torch.randn(1, g + 1, VOCAB, generator=gen)
    return ids, q_logits, g, p_logits


# How each release's _assisted_decoding calls _speculative_sampling (read in its
# transformers/generation/utils.py), and a stand-in with that release's parameters.
def _old(candidate_input_ids, candidate_logits, candidate_length, new_logits, is_done_candidate):
    raise AssertionError("replaced")


def _v517(candidate_input_ids, candidate_logits, candidate_length, new_logits, is_done_candidate,
          assistant_ensemble_weight=None):
    raise AssertionError("replaced")


def _new(candidate_input_ids, candidate_logits, candidate_length, new_logits,
         assistant_ensemble_weight=None):
    raise AssertionError("replaced")


CALLS = {
    "4.56": (_old, lambda f, a, done: f(*a, done)),
    "5.17": (_v517, lambda f, a, done: f(*a, done, assistant_ensemble_weight=None)),
    "5.24": (_new, lambda f, a, done: f(*a, assistant_ensemble_weight=None)),
}


@pytest.mark.parametrize("release", sorted(CALLS))
def test_dropin_binds_as_each_release_calls_it(tmp_path, monkeypatch, release):
    original, call = CALLS[release]
    monkeypatch.setattr(gu, "_speculative_sampling", original)
    mod = _dropin(tmp_path)
    mod.install(prompt_length=3)
    try:
        installed = gu._speculative_sampling
        assert installed is not original
        torch.manual_seed(0)
        tokens, n = call(installed, _inputs(), False)
        assert tokens.shape == (1, int(n) + 1) and 0 <= int(n) <= 4
    finally:
        mod.uninstall()
    assert gu._speculative_sampling is original


@pytest.mark.parametrize("release", sorted(CALLS))
def test_a_rule_reading_slot_and_lookahead_inputs_decides_in_the_dropin(tmp_path, monkeypatch,
                                                                       release):
    """Called as each release calls it, the drop-in of a rule that reads the slot
    features and the lookahead inputs hands the rule the decoders' values of them
    (``evolve.data.decode``) computed from the call's softmax distributions."""
    import numpy as np

    from evolve.data import decode as DE
    original, call = CALLS[release]
    monkeypatch.setattr(gu, "_speculative_sampling", original)
    tree = "pmin(1.0, add(pdiv(target_prob, draft_prob), mul(slot_tv, add(ahead, next_tv))))"
    src = modules.export_source(treeio.parse(tree), "hf", {"metrics": {}}, "slotted")
    path = tmp_path / "slotted_hf.py"
    path.write_text(src)
    mod = load_module_from(path, f"_hf_release_slotted_{release}")
    seen = []
    accept = mod.accept
    mod.accept = lambda u, *inputs: seen.append(inputs) or accept(u, *inputs)
    mod.install(prompt_length=3)
    try:
        ids, q_logits, g, p_logits = _inputs()
        tokens, n = call(gu._speculative_sampling, (ids, q_logits, g, p_logits), False)
        assert tokens.shape == (1, int(n) + 1) and 0 <= int(n) <= g
    finally:
        mod.uninstall()
    got = dict(zip(mod.INPUTS, seen[0]))
    q = q_logits.softmax(-1)[0].double().numpy()
    p = p_logits.softmax(-1)[0, :g].double().numpy()
    slots = DE.slot_features(p, q)
    want = {**slots, **DE.lookahead_features(slots["slot_tv"], g)}
    for name in ("slot_tv", "slot_kl_pq", "slot_kl_qp", "next_tv", "ahead"):
        np.testing.assert_allclose(got[name].numpy(), want[name], rtol=1e-12, atol=1e-15)


def test_dropin_done_candidate_adds_no_token(tmp_path, monkeypatch):
    """Every draft kept and the candidate done (end of sequence or maximum length):
    the drafts are returned and no token is added, as transformers does."""
    monkeypatch.setattr(gu, "_speculative_sampling", _old)
    mod = _dropin(tmp_path, "always_accept")
    mod.install(prompt_length=3)
    try:
        ids, q, g, p = _inputs()
        tokens, n = gu._speculative_sampling(ids, q, g, p, True)
        assert int(n) == g - 1 and tokens.tolist() == ids[:, -g:].tolist()
        tokens, n = gu._speculative_sampling(ids, q, g, p, False)
        assert int(n) == g and tokens.shape == (1, g + 1)
    finally:
        mod.uninstall()


def test_dropin_refuses_an_unknown_signature_in_one_line(tmp_path, monkeypatch):
    def unknown(candidate_input_ids, candidate_logits, new_logits, something_else):
        raise AssertionError("replaced")
    monkeypatch.setattr(gu, "_speculative_sampling", unknown)
    mod = _dropin(tmp_path)
    with pytest.raises(ValueError) as e:
        mod.install()
    msg = str(e.value)
    assert "\n" not in msg and "not a signature this drop-in knows" in msg
    assert "something_else" in msg
    assert gu._speculative_sampling is unknown            # nothing was replaced


def test_dropin_refuses_an_ensemble_weight(tmp_path, monkeypatch):
    monkeypatch.setattr(gu, "_speculative_sampling", _v517)
    mod = _dropin(tmp_path)
    mod.install()
    try:
        with pytest.raises(ValueError, match="assistant_ensemble_weight"):
            gu._speculative_sampling(*_inputs(), False, assistant_ensemble_weight=0.5)
    finally:
        mod.uninstall()


def _constraints(path: Path) -> Path:
    """The test environment's versions, but for what each release pins itself."""
    own = {"transformers", "huggingface-hub", "huggingface_hub", "tokenizers", "specevolve"}
    freeze = subprocess.run([sys.executable, "-m", "pip", "freeze", "--exclude-editable"],
                            capture_output=True, text=True, check=True).stdout.splitlines()
    keep = [line for line in freeze if "==" in line and "+" not in line
            and line.split("==")[0].lower() not in own]
    path.write_text("\n".join(keep) + "\n")
    return path


@pytest.mark.slow
@pytest.mark.parametrize("release", RELEASES)
def test_dropin_generation_under_release(tmp_path, release):
    site = tmp_path / "site"
    p = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet",
                        "--disable-pip-version-check", "--target", str(site),
                        "-c", str(_constraints(tmp_path / "constraints.txt")),
                        f"transformers=={release}"], capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    # the drop-in inside generate (every drafted position's distributions and decisions)
    # and the KV-cached decoder (each release's cache argument and masks), in one run
    script = (f"import sys, transformers, pytest\n"
              f"assert transformers.__version__ == {release!r}, transformers.__version__\n"
              f"sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', '-p', 'no:hypothesispytest', "
              f"'tests/test_export.py', 'tests/test_faithful.py', 'tests/test_hf_cache.py', "
              f"'-k', 'hf_lenient or install_pins or every_drafted or test_hf_cache']))\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(ROOT)]))
    p = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
    assert "12 passed" in p.stdout, p.stdout[-2000:]
