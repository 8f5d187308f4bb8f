"""A neural draft/target pair trained here: small byte-level GPT-2 models.

The same corpus and file split as the n-gram pair (``evolve.data.sources.ngram``
with its default seed 0): both models train on the LM files, the held-out files
stay prompt pools, so ``evolve data trace --backend hf`` with the default corpus
and ``--seed 0`` prompts them with text they never saw. The target is a GPT-2
of about 0.86M parameters, the draft one of about 0.09M (9x fewer); both
read bytes (``evolve.data.sources.byte_tokenizer``), trained with AdamW on
random windows of the concatenated training files, on CPU, for a fixed number
of steps: same seed, same weights (deterministic algorithms, seeded init and
batches). Saved with ``save_pretrained`` (model, tokenizer) and a
``training.json`` with the settings, losses and held-out cross-entropy.

    python -m evolve.data.sources.neural_pair --out datasets/neural-pair   # make neural-pair
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from evolve.data.sources import ngram
from evolve.data.sources import ngram_lm as LM
from evolve.data.sources.byte_tokenizer import VOCAB, byte_tokenizer
from evolve.io.atomic import atomic_write_text

SEPARATOR = 0          # byte between training files (never in Python source)


@dataclass(frozen=True)
class ModelSpec:
    n_layer: int
    n_embd: int
    n_head: int
    steps: int
    lr: float


# Sized for about 10 minutes of training on 2 shared CPU cores (both models).
TARGET = ModelSpec(n_layer=4, n_embd=128, n_head=4, steps=300, lr=3e-3)
DRAFT = ModelSpec(n_layer=1, n_embd=64, n_head=2, steps=300, lr=5e-3)


@dataclass(frozen=True)
class TrainConfig:
    seed: int = 0               # also the file split's seed (ngram.TraceConfig(seed))
    context: int = 64           # training window, tokens
    batch: int = 24
    n_positions: int = 256      # position table: prompts + decoded blocks must fit
    warmup: float = 0.05        # share of steps with a linear warm-up
    eval_bytes: int = 200_000   # held-out bytes scored after training (valid pool)


def training_data(cfg: TrainConfig):
    """(training bytes as one uint8 array, held-out valid-pool bytes, corpus)."""
    corpus = LM.Corpus.load()
    lm_files, _, pools = ngram.file_split(len(corpus), ngram.TraceConfig(seed=cfg.seed))
    sep = bytes([SEPARATOR])
    train = sep.join(corpus.docs[i] for i in lm_files)
    held = sep.join(corpus.docs[i] for i in pools["valid"])[:cfg.eval_bytes]
    return np.frombuffer(train, np.uint8), np.frombuffer(held, np.uint8), corpus


def _model(spec: ModelSpec, cfg: TrainConfig):
    # lazy: start-up (transformers loads only where it is used)
    from transformers import GPT2Config, GPT2LMHeadModel
    return GPT2LMHeadModel(GPT2Config(
        vocab_size=VOCAB, n_positions=cfg.n_positions, n_layer=spec.n_layer,
        n_embd=spec.n_embd, n_head=spec.n_head, bos_token_id=SEPARATOR,
        eos_token_id=SEPARATOR, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))


def train_model(spec: ModelSpec, cfg: TrainConfig, data: np.ndarray, seed: int, log=None):
    """Train one model; returns (model, per-step losses)."""
    import torch    # lazy: start-up (torch loads only where it is used)
    torch.manual_seed(seed)
    model = _model(spec, cfg)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=spec.lr, betas=(0.9, 0.95),
                            weight_decay=0.01)
    warm = max(1, int(cfg.warmup * spec.steps))

    def lr_at(step):
        if step < warm:
            return (step + 1) / warm
        t = (step - warm) / max(1, spec.steps - warm)
        return 0.1 + 0.9 * 0.5 * (1.0 + np.cos(np.pi * t))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    rng = np.random.default_rng(seed)
    losses = []
    t0 = time.perf_counter()
    for step in range(spec.steps):
        starts = rng.integers(0, data.size - cfg.context, size=cfg.batch)
        x = torch.from_numpy(np.stack([data[s:s + cfg.context] for s in starts]).astype(np.int64))
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
        if log and (step % 100 == 0 or step == spec.steps - 1):
            log(f"  step {step:4d}/{spec.steps}: loss {np.mean(losses[-50:]):.3f} nats/byte "
                f"({time.perf_counter() - t0:.0f} s)")
    model.eval()
    return model, losses


def cross_entropy(model, data: np.ndarray, context: int) -> float:
    """Mean next-byte loss (nats) over non-overlapping windows of held-out bytes."""
    import torch    # lazy: start-up (torch loads only where it is used)
    n = (data.size // context) * context
    x = torch.from_numpy(data[:n].reshape(-1, context).astype(np.int64))
    total = 0.0
    with torch.no_grad():
        for b in range(0, x.shape[0], 64):
            xb = x[b:b + 64]
            total += float(model(input_ids=xb, labels=xb).loss) * xb.shape[0]
    return total / x.shape[0]


def build(out: Path, cfg: TrainConfig = TrainConfig(), log=print) -> dict:
    import torch    # lazy: start-up (torch loads only where it is used)
    torch.use_deterministic_algorithms(True)
    data, held, corpus = training_data(cfg)
    log(f"training bytes: {data.size:,}; held-out (valid pool) bytes: {held.size:,}")
    report = {"config": asdict(cfg), "corpus_crc32": corpus.fingerprint(),
              "python_version": LM.python_version(), "torch": torch.__version__,
              "threads": torch.get_num_threads(), "training_bytes": int(data.size)}
    for i, (name, spec) in enumerate((("target", TARGET), ("draft", DRAFT))):
        t0 = time.perf_counter()
        log(f"{name}: {asdict(spec)}")
        model, losses = train_model(spec, cfg, data, cfg.seed * 1000 + i, log)
        secs = time.perf_counter() - t0
        ce = cross_entropy(model, held, cfg.context)
        params = int(sum(p.numel() for p in model.parameters()))
        log(f"{name}: {params:,} parameters, {secs:.0f} s, held-out {ce:.3f} nats/byte")
        model.save_pretrained(out / name)
        byte_tokenizer().save_pretrained(out / name)
        report[name] = {**asdict(spec), "parameters": params, "seconds": round(secs, 1),
                        "final_loss": float(np.mean(losses[-50:])),
                        "heldout_nats_per_byte": ce}
    atomic_write_text(out / "training.json", json.dumps(report, indent=2, sort_keys=True))
    return report


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("datasets/neural-pair"))
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    build(args.out, TrainConfig(seed=args.seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
