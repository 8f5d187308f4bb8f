"""The neural pair's training (evolve/data/sources/neural_pair.py), at toy size:
same seed, same weights; another seed, other weights; the loss goes down."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from evolve.data.sources import neural_pair as N  # noqa: E402

TOY = N.ModelSpec(n_layer=1, n_embd=16, n_head=2, steps=12, lr=1e-2)
CFG = N.TrainConfig(context=16, batch=4, n_positions=32)
DATA = np.frombuffer(b"def f(x):\n    return x + 1\n" * 40, np.uint8)


def _weights(seed):
    torch.use_deterministic_algorithms(True)
    model, losses = N.train_model(TOY, CFG, DATA, seed)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, losses


def test_same_seed_same_weights():
    a, la = _weights(5)
    b, lb = _weights(5)
    c, _ = _weights(6)
    assert la == lb
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)
    assert np.mean(la[-3:]) < np.mean(la[:3])

