"""A draft built from a target: its first layers, the last of them distilled on the
target's own answers.

The draft is the target's embeddings, its first ``layers`` transformer blocks and its
final norm and head (as LayerSkip's early exit reads a model's first layers): a Llama
model of the same configuration with fewer layers, so it shares the target's tokenizer
and vocabulary and loads with plain ``AutoModelForCausalLM``. Untrained, such a draft
agrees with the target's argmax on few tokens; its last ``trained`` blocks and its norm
are trained here (the blocks below stay the target's, as do the embeddings and the tied
head):

1. the target samples ``samples`` answers (temperature 1, up to ``max_new`` tokens or
   its end-of-text token) to each training prompt, in batches with its KV cache; at
   every answer position the distribution it sampled from is kept as its ``top_k``
   most likely tokens and the mass of the rest, and the hidden state its block
   ``layers - trained`` read is kept too (the same forward passes: the frozen blocks
   are never run again);
2. the trained blocks, read from those hidden states, are fitted with AdamW to
   minimise KL(target || draft) at every answer position, over the kept tokens and the
   rest as one more outcome, on batches of whole answers.

So training costs the trained blocks and the head per position, not the whole draft.
Randomness is explicit: the sampling draws from a ``torch.Generator`` and the batches
from a numpy Generator, both seeded from the specification's ``seed``; nothing else is random (the
draft starts as a copy of the target's layers, without dropout). The same
specification, target and machine (the same torch build and thread count) give the
same draft bytes.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import asdict, dataclass

import numpy as np

from evolve.data.sources.hf.cache import call_names
from evolve.errors import EvolveError


class DraftError(EvolveError):
    """A draft specification that cannot be built: one line naming the field."""


@dataclass(frozen=True)
class DraftSpec:
    """How a draft is built (stored beside it in ``draft.json``)."""
    layers: int = 8            # the draft's blocks: the target's first ones
    trained: int = 1           # of which the last ones are trained (the others: frozen)
    samples: int = 1           # target answers sampled per training prompt
    max_new: int = 48          # tokens per sampled answer at most
    prompts: int | None = None  # training prompts used (None: all)
    top_k: int = 64            # target probabilities kept per position (the rest: one mass)
    epochs: int = 2            # passes over the answers
    batch: int = 8             # answers per step
    lr: float = 5e-4
    warmup: float = 0.05       # share of steps with a linear warm-up, then cosine to 10%
    sample_batch: int = 32     # prompts the target answers together
    seed: int = 0

    def validate(self) -> None:
        for name in ("layers", "trained", "samples", "max_new", "top_k", "epochs", "batch",
                     "sample_batch"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise DraftError.of(name, f"{v!r} is invalid; expected a whole number >= 1")
        if self.trained > self.layers:
            raise DraftError.of("trained", f"{self.trained} is invalid; expected at most "
                                f"layers ({self.layers})")
        if self.prompts is not None and (not isinstance(self.prompts, int) or self.prompts < 1):
            raise DraftError.of("prompts", f"{self.prompts!r} is invalid; expected >= 1 or none")
        if not (isinstance(self.lr, (int, float)) and math.isfinite(self.lr) and self.lr > 0):
            raise DraftError.of("lr", f"{self.lr!r} is invalid; expected a number > 0")
        if not 0 <= self.warmup < 1:
            raise DraftError.of("warmup", f"{self.warmup!r} is invalid; expected 0 <= w < 1")
        if not 0 <= self.seed < 2 ** 63:
            raise DraftError.of("seed", f"{self.seed!r} is invalid; expected an integer >= 0")

    @property
    def frozen(self) -> int:
        return self.layers - self.trained


# ------------------------------------------------------------------ the target's answers

def left_pad(seqs, pad: int):
    """(ids, attention mask, position ids) of token lists, left-padded to one length."""
    import torch    # lazy: start-up (torch loads only where it is used)
    n = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), n), pad, dtype=torch.long)
    mask = torch.zeros((len(seqs), n), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, n - len(s):] = torch.as_tensor(s, dtype=torch.long)
        mask[i, n - len(s):] = 1
    return ids, mask, (mask.cumsum(1) - 1).clamp_min(0)


@dataclass
class Answers:
    """The target's sampled answers: per answer, its prompt ids, its tokens, at each
    token the top-k ids and probabilities of the distribution it was sampled from, and
    (when kept) the hidden states a block read at the prompt's and answer's positions
    (the last answer token's excepted: nothing is predicted after it)."""
    prompts: list
    tokens: list
    top_ids: list             # per answer, (len, k) int32
    top_probs: list           # per answer, (len, k) float32
    hidden: list              # per answer, (prompt + len - 1, d) float32 (or empty)

    @property
    def positions(self) -> int:
        return sum(len(t) for t in self.tokens)


def sample_answers(model, prompts, spec: DraftSpec, end: int | None, generator,
                   progress=None, hidden_at: int | None = None) -> Answers:
    """``samples`` answers (of ``spec``) to each prompt (token id lists), sampled at
    temperature 1 with ``generator`` (a torch.Generator), in batches of ``sample_batch``
    prompts with the model's KV cache; an answer stops after ``end`` or ``max_new``
    tokens.
    ``hidden_at``: keep the hidden states entering that block (0: the embeddings)."""
    import torch    # lazy: start-up (torch loads only where it is used)
    from transformers import DynamicCache    # lazy: an optional extra
    jobs = [p for p in prompts for _ in range(spec.samples)]
    out = Answers([], [], [], [], [])
    pad = 0 if end is None else end
    keep = hidden_at is not None
    cache_arg, _ = call_names(model)
    t0 = time.perf_counter()
    for b in range(0, len(jobs), spec.sample_batch):
        batch = jobs[b:b + spec.sample_batch]
        ids, mask, pos = left_pad(batch, pad)
        cache = DynamicCache()
        live = torch.ones(len(batch), dtype=torch.bool)
        toks, tids, tprobs, hids = [], [], [], []
        step_ids = ids
        with torch.inference_mode():
            for _ in range(spec.max_new):
                res = model(input_ids=step_ids, attention_mask=mask, position_ids=pos,
                            use_cache=True, output_hidden_states=keep, **{cache_arg: cache})
                if keep:
                    hids.append(res.hidden_states[hidden_at].float())
                probs = torch.softmax(res.logits[:, -1].double(), dim=-1)
                nxt = torch.multinomial(probs, 1, generator=generator).squeeze(1)
                top = torch.topk(probs, spec.top_k, dim=-1)
                nxt = torch.where(live, nxt, torch.full_like(nxt, pad))
                toks.append(nxt)
                tids.append(top.indices.to(torch.int32))
                tprobs.append(top.values.float())
                if end is not None:
                    live &= nxt != end
                if not bool(live.any()):
                    break
                step_ids = nxt[:, None]
                mask = torch.cat([mask, torch.ones((len(batch), 1), dtype=mask.dtype)], 1)
                pos = pos[:, -1:] + 1
        T = torch.stack(toks, 1).numpy()
        I = torch.stack(tids, 1).numpy()
        P = torch.stack(tprobs, 1).numpy()
        H = torch.cat(hids, 1).numpy() if keep else None
        width = ids.shape[1]
        for i, p in enumerate(batch):
            row = T[i].tolist()
            n = row.index(end) + 1 if end is not None and end in row else len(row)
            out.prompts.append(list(p))
            out.tokens.append(np.asarray(row[:n], dtype=np.int64))
            out.top_ids.append(I[i, :n])
            out.top_probs.append(P[i, :n])
            # the prompt's positions (right-aligned in the prefill), then answer tokens
            out.hidden.append(H[i, width - len(p):width + n - 1].copy() if keep else None)
        if progress:
            progress(f"  target answers: {len(out.tokens)}/{len(jobs)} "
                     f"({out.positions:,} tokens, {time.perf_counter() - t0:.0f} s)")
    return out


# ------------------------------------------------------------------ the draft

def draft_from(target, layers: int):
    """A Llama model of the target's configuration with its first ``layers`` blocks,
    holding copies of the target's weights (embeddings, those blocks, norm, head)."""
    return _copy(target, range(layers))


def _copy(target, blocks):
    """A model of the target's configuration whose blocks are copies of the target's
    blocks ``blocks`` (in that order), with copies of its embeddings, norm and head."""
    import torch    # lazy: start-up (torch loads only where it is used)
    from transformers import AutoModelForCausalLM    # lazy: an optional extra
    blocks = list(blocks)
    n = target.config.num_hidden_layers
    if not blocks or max(blocks) >= n:
        raise DraftError.of("layers", f"{len(blocks)} is invalid; expected 1..{n} (the "
                            "target's layers)")
    cfg = copy.deepcopy(target.config)
    cfg.num_hidden_layers = len(blocks)
    if getattr(cfg, "layer_types", None) is not None:
        cfg.layer_types = [cfg.layer_types[b] for b in blocks]
    with torch.device("meta"):      # no random initialisation: every weight is copied
        draft = AutoModelForCausalLM.from_config(cfg)
    state = {}
    for k, v in target.state_dict().items():
        if k.startswith("model.layers."):
            _, _, b, rest = k.split(".", 3)
            if int(b) in blocks:
                state[f"model.layers.{blocks.index(int(b))}.{rest}"] = v.detach().clone()
        else:
            state[k] = v.detach().clone()
    draft.load_state_dict(state, strict=False, assign=True)
    if cfg.tie_word_embeddings:
        draft.tie_weights()
    draft.model.rotary_emb = type(draft.model.rotary_emb)(config=cfg)    # its buffers
    meta = [k for k, v in draft.state_dict().items() if v.is_meta]
    if meta:
        raise DraftError(f"the draft's weights {meta[:2]} have no copy in the target")
    return draft.eval()


def kl_topk(logits, ids, probs):
    """Mean KL(p || q) over positions, p given by its top-k ``ids``/``probs`` (N, k) and
    the rest of its mass as one outcome, q = softmax(``logits``) (N, V)."""
    import torch    # lazy: start-up (torch loads only where it is used)
    logq = torch.log_softmax(logits.float(), dim=-1)
    lq = logq.gather(1, ids.long())
    p = probs.clamp_min(0)
    rest_p = (1 - p.sum(1)).clamp_min(1e-12)
    rest_q = (1 - lq.exp().sum(1)).clamp_min(1e-12)
    kl = (p * (torch.log(p.clamp_min(1e-30)) - lq)).sum(1)
    kl = kl + rest_p * (torch.log(rest_p) - torch.log(rest_q))
    return kl.mean()


def _right_aligned(rows, width: int, dim: int):
    """(B, width, dim) float32 of (n_i, dim) arrays, each ending at the last column."""
    import torch    # lazy: start-up (torch loads only where it is used)
    x = torch.zeros((len(rows), width, dim), dtype=torch.float32)
    for r, h in enumerate(rows):
        x[r, width - len(h):] = torch.from_numpy(h)
    return x


def train(head, answers: Answers, spec: DraftSpec, progress=None) -> list:
    """Fit ``head`` (a model of the ``trained`` blocks, its norm and the tied output
    layer, fed the kept hidden states as its input embeddings) to KL(target || draft)
    on the answers; returns the loss of every step."""
    import torch    # lazy: start-up (torch loads only where it is used)
    params = [p for n, p in head.named_parameters()
              if n.startswith("model.layers.") or n.startswith("model.norm.")]
    for p in head.parameters():
        p.requires_grad_(False)
    for p in params:
        p.requires_grad_(True)
    n = len(answers.tokens)
    per_epoch = max(1, n // spec.batch)
    steps = spec.epochs * per_epoch
    opt = torch.optim.AdamW(params, lr=spec.lr, betas=(0.9, 0.95), weight_decay=0.0)
    warm = max(1, int(spec.warmup * steps))

    def lr_at(step):
        if step < warm:
            return (step + 1) / warm
        t = (step - warm) / max(1, steps - warm)
        return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * t))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    rng = np.random.default_rng(np.random.SeedSequence([spec.seed, 1]))
    dim = answers.hidden[0].shape[1]
    losses, t0 = [], time.perf_counter()
    head.train()
    step = 0
    for _ in range(spec.epochs):
        order = rng.permutation(n)
        for b in range(per_epoch):
            pick = order[b * spec.batch:(b + 1) * spec.batch]
            lens = [len(answers.hidden[i]) for i in pick]
            L = max(lens)
            x = _right_aligned([answers.hidden[i] for i in pick], L, dim)
            mask = torch.zeros((len(pick), L), dtype=torch.long)
            for r, k in enumerate(lens):
                mask[r, L - k:] = 1
            pos = (mask.cumsum(1) - 1).clamp_min(0)
            rows, cols = [], []
            for r, i in enumerate(pick):       # the positions that predict answer tokens
                k = len(answers.tokens[i])
                rows += [r] * k
                cols += list(range(L - k, L))
            h = head.model(inputs_embeds=x, attention_mask=mask,
                           position_ids=pos).last_hidden_state
            logits = head.lm_head(h[rows, cols])
            tid = torch.from_numpy(np.concatenate([answers.top_ids[i] for i in pick]))
            tpr = torch.from_numpy(np.concatenate([answers.top_probs[i] for i in pick]))
            loss = kl_topk(logits, tid, tpr)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            sched.step()
            losses.append(float(loss.detach()))
            step += 1
            if progress and (step % 25 == 0 or step == steps):
                progress(f"  step {step}/{steps}: KL {np.mean(losses[-25:]):.3f} nats "
                         f"({time.perf_counter() - t0:.0f} s)")
    head.eval()
    for p in head.parameters():
        p.requires_grad_(False)
    return losses


def assemble(target, head, spec: DraftSpec):
    """The draft: the target's first ``frozen`` blocks, then ``head``'s trained blocks
    and norm (embeddings and head: the target's)."""
    import torch    # lazy: start-up (torch loads only where it is used)
    draft = draft_from(target, spec.layers)
    state, trained = draft.state_dict(), head.state_dict()
    with torch.no_grad():
        for k, v in trained.items():
            if k.startswith("model.layers."):
                _, _, j, rest = k.split(".", 3)
                state[f"model.layers.{spec.frozen + int(j)}.{rest}"].copy_(v)
        state["model.norm.weight"].copy_(trained["model.norm.weight"])
    return draft


# ------------------------------------------------------------------ held-out agreement

def agreement(target, draft, answers: Answers, pad: int, batch: int = 16) -> dict:
    """On answers the target wrote (``answers``, held out), at every answer position:
    how often the draft's argmax is the target's, and the mean total variation
    distance between the two full next-token distributions."""
    import torch    # lazy: start-up (torch loads only where it is used)
    agree = tv = 0.0
    count = 0
    with torch.inference_mode():
        for b in range(0, len(answers.tokens), batch):
            pick = range(b, min(b + batch, len(answers.tokens)))
            seqs = [answers.prompts[i] + answers.tokens[i].tolist()[:-1] for i in pick]
            ids, mask, pos = left_pad(seqs, pad)
            L = ids.shape[1]
            sel = torch.zeros_like(mask, dtype=torch.bool)
            for r, i in enumerate(pick):
                sel[r, L - len(answers.tokens[i]):] = True
            p = torch.softmax(target(input_ids=ids, attention_mask=mask,
                                     position_ids=pos).logits[sel].double(), -1)
            q = torch.softmax(draft(input_ids=ids, attention_mask=mask,
                                    position_ids=pos).logits[sel].double(), -1)
            agree += float((p.argmax(-1) == q.argmax(-1)).sum())
            tv += float(0.5 * (p - q).abs().sum(-1).sum())
            count += int(sel.sum())
    return {"positions": count, "argmax_agreement": agree / max(count, 1),
            "mean_tv": tv / max(count, 1)}


def build_draft(target, train_prompts, spec: DraftSpec, end: int | None, progress=None):
    """(the draft, its report): the target's answers to ``train_prompts`` (token id
    lists) sampled, and the draft's trained blocks distilled on them."""
    import torch    # lazy: start-up (torch loads only where it is used)
    spec.validate()
    prompts = list(train_prompts)[:spec.prompts]
    gen = torch.Generator().manual_seed(spec.seed)
    t0 = time.perf_counter()
    answers = sample_answers(target, prompts, spec, end, gen, progress,
                             hidden_at=spec.frozen)
    t1 = time.perf_counter()
    head = _copy(target, range(spec.frozen, spec.layers))
    losses = train(head, answers, spec, progress)
    draft = assemble(target, head, spec)
    t2 = time.perf_counter()
    report = {"spec": asdict(spec), "prompts": len(prompts), "answers": len(answers.tokens),
              "answer_tokens": answers.positions, "steps": len(losses),
              "sampling_seconds": round(t1 - t0, 1), "training_seconds": round(t2 - t1, 1),
              "loss_first": float(np.mean(losses[:10])), "loss_last": float(np.mean(losses[-10:])),
              "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
              "parameters": int(sum(p.numel() for p in draft.parameters()))}
    return draft, report
