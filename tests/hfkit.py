"""Tiny random-init GPT-2 pairs for the hf-backend tests (no network, built in a second).

The init scale (0.15) makes the distributions peaked enough that the draft often
disagrees with the target (standard acceptance about 0.45), so a wrong acceptance
count shows up in the free-running comparison."""

from __future__ import annotations

from pathlib import Path

VOCAB = 256
TARGET = {"n_layer": 2, "n_embd": 64, "n_head": 2}
DRAFT = {"n_layer": 1, "n_embd": 32, "n_head": 2}


def save_model(path: Path, seed: int, dims: dict, vocab: int = VOCAB, ids: dict | None = None,
               n_positions: int = 256, init: float = 0.15, extra_tokens: int = 0) -> Path:
    """A random-init GPT-2 LM and a byte tokenizer, saved with save_pretrained; the
    tokenizer holds ``vocab`` tokens, plus ``extra_tokens`` the model has no logits for."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from evolve.data.sources.byte_tokenizer import byte_tokenizer
    torch.manual_seed(seed)
    cfg = GPT2Config(vocab_size=vocab, n_positions=n_positions, initializer_range=init,
                     bos_token_id=0, eos_token_id=0, **dims)
    model = GPT2LMHeadModel(cfg)
    model.save_pretrained(path)
    tok = byte_tokenizer(ids)
    if vocab + extra_tokens > VOCAB:
        tok.add_tokens([f"<extra_{i}>" for i in range(vocab + extra_tokens - VOCAB)])
    tok.save_pretrained(path)
    return path


def test_device() -> str:
    """The torch device the hf tests run their models and tensors on: torch's CPU, or,
    with ``EVOLVE_TEST_ON_GPU=1`` on a machine with a GPU, the GPU itself (the same
    comparisons then check the device code on CUDA)."""
    import os

    import torch
    return ("cuda" if os.environ.get("EVOLVE_TEST_ON_GPU") == "1"
            and torch.cuda.is_available() else "cpu")


def tiny_pair(root: Path) -> tuple[Path, Path]:
    return (save_model(root / "target", 1, TARGET), save_model(root / "draft", 2, DRAFT))


PROMPTS = ["def f(x):\n    return", "import os\n", "class A:\n    def", "for i in range(",
           "print('hello", "x = [1, 2,", "while True:\n", "# a comment about", "if a and b",
           "return {'k':", "with open(p) as", "try:\n    pass\nexcept"]


def write_prompts(path: Path) -> Path:
    import json
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in PROMPTS))
    return path


ENV = {"HF_HUB_OFFLINE": "1"}          # on top of clikit.ENV: never reach a hub


def invoke(*args):
    from tests import clikit
    return clikit.invoke(*args, env=ENV)


def _models(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf_pair")
    target, draft = tiny_pair(root)
    return target, draft, write_prompts(root / "prompts.jsonl")


def models_fixture():
    """The module-scoped ``models`` fixture (target dir, draft dir, prompts file)."""
    import pytest
    return pytest.fixture(scope="module", name="models")(_models)


def write_corpus(directory: Path, files: int, line: str) -> Path:
    """``files`` small text files of 30 lines each (``line`` formatted with i, j)."""
    directory.mkdir()
    for i in range(files):
        (directory / f"f{i}.txt").write_text("".join(line.format(i=i, j=j) for j in range(30)))
    return directory
