"""The scope part of every exported module: the rule decides what it was scored on.

On traces the exact objectives apply a rule to the drafts among the draft's
``top_k`` most probable tokens (ties: lower id first) and the standard rule
min(1, p/q) to the others, at a constant draft length and one temperature with no
top-k or top-p truncation (``evolve.data.traces.scope_of``). An exported module
keeps that scope: ``SCOPE``, ``TOP_K``, ``BLOCK_SIZE`` and ``TEMPERATURE``, and

- ``draft_rank(q, token)``: the rank of each drafted token under the draft's
  distribution, the order the traces' candidates were taken in;
- ``acceptance(draft_rank, <inputs>)``: the acceptance probability the rule was
  scored with, clip(threshold, 0, 1) (NaN: 0) inside the scope and the standard
  rule outside it; in greedy decoding (``DECODING``, a task champion's scope) 1 for
  a draft that is the target's argmax and clip(threshold, 0, 1) for every other;
- ``accept(u, <inputs>, draft_rank=...)``: ``u < acceptance(...)``; a module of a
  top-k scope refuses a call without the ranks (a rule applied to every drafted
  token is not the rule that was scored).

A rule scored on token splits (the seed's world) has no scope: ``accept(u,
<inputs>)`` is ``u < threshold(...)`` as before. The engine formats compute the
ranks from the probability tensors they hold (``evolve.export.engines``).
"""

from __future__ import annotations

import inspect

import numpy as np

from evolve.export.backends import Backend
from evolve.lang import codegen

# The scope's code, defined once for each array library: a ``Rule`` evaluates with these
# functions in this process (``evolve.api.acceptance_rule``), and every export writes
# their source into its module (``scope_source``), so the two cannot decide apart.


def numpy_draft_rank(q, token):
    """The rank of each drafted token under the draft's distribution (0: the most
    probable; ties: lower id first), as the traces took their top-k candidates.
    q: [..., vocab] probabilities; token: [...] ids."""
    q = np.asarray(q)
    token = np.asarray(token, dtype=np.int64)
    qx = np.take_along_axis(q, token[..., None], axis=-1)
    ids = np.arange(q.shape[-1])
    return ((q > qx) | ((q == qx) & (ids < token[..., None]))).sum(axis=-1)


def numpy_scoped(h, draft_rank, top_token_match, draft_prob, target_prob, top_k, greedy):
    """The acceptance probability a rule of threshold h was scored with: clip(h, 0, 1)
    (NaN: 0) for drafts among the draft's top top_k (draft_rank < top_k), the standard
    rule min(1, target_prob / draft_prob) for the others (top_k None: every draft is
    the rule's); in greedy decoding 1 for a draft that is the target's argmax
    (top_token_match), clip(h, 0, 1) for every other."""
    h = np.asarray(h)
    a = np.where(h > 0, np.where(h > 1, 1, h), 0).astype(h.dtype)
    if greedy:                     # a draft that is the target's argmax is kept
        return np.where(np.asarray(top_token_match, dtype=bool), 1, a).astype(h.dtype)
    if top_k is None:
        return a
    with np.errstate(all="ignore"):
        q = np.asarray(draft_prob, dtype=h.dtype)
        std = np.where(q > 0, np.minimum(1, np.asarray(target_prob, dtype=h.dtype) / q), 0)
    return np.where(np.asarray(draft_rank) < top_k, a, std).astype(h.dtype)


def torch_draft_rank(q, token):
    """The rank of each drafted token under the draft's distribution (0: the most
    probable; ties: lower id first), as the traces took their top-k candidates.
    q: [..., vocab] probabilities; token: [...] ids."""
    import torch  # lazy: the core install has no torch
    token = torch.as_tensor(token, device=q.device).long()
    qx = torch.gather(q, -1, token[..., None])
    ids = torch.arange(q.shape[-1], device=q.device)
    return ((q > qx) | ((q == qx) & (ids < token[..., None]))).sum(dim=-1)


def torch_scoped(h, draft_rank, top_token_match, draft_prob, target_prob, top_k, greedy):
    """The acceptance probability a rule of threshold h was scored with: clip(h, 0, 1)
    (NaN: 0) for drafts among the draft's top top_k (draft_rank < top_k), the standard
    rule min(1, target_prob / draft_prob) for the others (top_k None: every draft is
    the rule's); in greedy decoding 1 for a draft that is the target's argmax
    (top_token_match), clip(h, 0, 1) for every other."""
    import torch  # lazy: the core install has no torch
    a = torch.where(h > 0, torch.where(h > 1, torch.ones_like(h), h), torch.zeros_like(h))
    if greedy:                     # a draft that is the target's argmax is kept
        match = torch.as_tensor(top_token_match, device=h.device).bool()
        return torch.where(match, torch.ones_like(h), a)
    if top_k is None:
        return a
    q = torch.as_tensor(draft_prob, device=h.device).to(h.dtype)
    p = torch.as_tensor(target_prob, device=h.device).to(h.dtype)
    std = torch.where(q > 0, torch.clamp(p / q, max=1.0), torch.zeros_like(q))
    return torch.where(torch.as_tensor(draft_rank, device=h.device) < top_k, a, std)


CODE = {"numpy": (numpy_draft_rank, numpy_scoped), "torch": (torch_draft_rank, torch_scoped)}


def _written(fn, name: str) -> str:
    """A scope function's source as an exported module holds it, under ``name`` (its
    lazy import dropped: the module imports its array library)."""
    lines = inspect.getsource(fn).splitlines()
    lines[0] = lines[0].replace(f"def {fn.__name__}(", f"def {name}(", 1)
    return "\n".join(line for line in lines if "# lazy:" not in line) + "\n"


_ACCEPTANCE = {
    "numpy": '''

def acceptance(draft_rank, {args}):
    """The acceptance probability the rule was scored with (scoped): clip(threshold, 0,
    1) (NaN: 0) for drafts among the draft's top TOP_K, the standard rule min(1,
    target_prob / draft_prob) for the others; in greedy decoding (DECODING) 1 for a
    draft that is the target's argmax, clip(threshold, 0, 1) for every other."""
    h = threshold({args})
    return scoped(h, draft_rank, top_token_match, draft_prob, target_prob, TOP_K,
                  DECODING == "greedy")


def accept(u, {args}, draft_rank=None):
    """True where the drafted token is accepted, as the rule was scored:
    u < acceptance(draft_rank, ...). draft_rank (draft_rank(q, token)) is needed when
    the rule was scored on the draft's top-k only (TOP_K is not None)."""
    if TOP_K is not None and draft_rank is None:
        raise ValueError(f"accept: pass draft_rank: the rule was scored on drafts among "
                         f"the draft's top {{TOP_K}} (the standard rule decides the others)")
    return np.asarray(u) < acceptance(0 if draft_rank is None else draft_rank, {args})
''',
    "torch": '''

def acceptance(draft_rank, {args}):
    """The acceptance probability the rule was scored with (scoped): clip(threshold, 0,
    1) (NaN: 0) for drafts among the draft's top TOP_K, the standard rule min(1,
    target_prob / draft_prob) for the others; in greedy decoding (DECODING) 1 for a
    draft that is the target's argmax, clip(threshold, 0, 1) for every other."""
    h = threshold({args})
    return scoped(h, draft_rank, top_token_match, draft_prob, target_prob, TOP_K,
                  DECODING == "greedy")


def accept(u, {args}, draft_rank=None):
    """True where the drafted token is accepted, as the rule was scored:
    u < acceptance(draft_rank, ...). draft_rank (draft_rank(q, token)) is needed when
    the rule was scored on the draft's top-k only (TOP_K is not None)."""
    if TOP_K is not None and draft_rank is None:
        raise ValueError(f"accept: pass draft_rank: the rule was scored on drafts among "
                         f"the draft's top {{TOP_K}} (the standard rule decides the others)")
    a = acceptance(0 if draft_rank is None else draft_rank, {args})
    return torch.as_tensor(u, device=a.device) < a
''',
}

_PLAIN_ACCEPT = {
    "numpy": '''

def accept(u, {args}):
    """True where the drafted token is accepted: u < threshold(...)."""
    return np.asarray(u) < threshold({args})
''',
    "torch": '''

def accept(u, {args}):
    """True where the drafted token is accepted: u < threshold(...)."""
    h = threshold({args})
    return torch.as_tensor(u, device=h.device) < h
''',
}


def scope_constants(scope: dict | None) -> str:
    """``SCOPE`` and its parts as module constants (None values for a token rule)."""
    sc = scope or {}
    decoding = sc.get("decoding", "sample") if scope else None
    return (f"SCOPE = {codegen.python_literal(scope)}\n"
            f"DECODING = {decoding!r}   # greedy: argmax drafts kept, the rule decides the rest\n"
            f"TOP_K = {sc.get('top_k')!r}      # None: the rule decides every drafted token\n"
            f"BLOCK_SIZE = {sc.get('block_size')!r}      # drafted tokens per target call\n"
            f"TEMPERATURE = {sc.get('temperature')!r}   # both models, no top-k/top-p\n")


def scope_source(scope: dict | None, backend: Backend, inputs: tuple) -> str:
    """The module text after ``threshold``: ``accept`` alone for a rule with no scope
    (token splits), else ``draft_rank``, ``acceptance`` and ``accept``."""
    args = ", ".join(inputs)
    if scope is None:
        return _PLAIN_ACCEPT[backend.name].format(args=args)
    if "draft_prob" not in inputs or "target_prob" not in inputs \
            or "top_token_match" not in inputs:
        raise ValueError("a scoped rule's signature holds draft_prob, target_prob and "
                         "top_token_match")
    rank, scoped = CODE[backend.name]
    return ("\n\n" + _written(rank, "draft_rank") + "\n\n" + _written(scoped, "scoped")
            + _ACCEPTANCE[backend.name].format(args=args))


def scope_lines(scope: dict | None) -> list[str]:
    """The header lines that say what the deployed rule shares with the scored one."""
    if scope is None:
        return ["Scope: scored on token splits (no draft/target pair): accept(u, ...) is "
                "u < threshold(...)."]
    k, t = scope.get("top_k"), scope.get("temperature")
    if scope.get("decoding") == "greedy":
        return ["Scope (what the rule was scored with, and keeps here): greedy decoding: the "
                "draft proposes its argmax; a draft that is the target's argmax is kept, the "
                "rule decides every other (u < clip(threshold)), and after the first "
                "rejection the target's argmax is emitted;",
                f"  {scope.get('block_size')} drafted tokens per target call (a constant draft "
                "length)."]
    who = ("every drafted token" if k is None else
           f"drafts among the draft's top {k} tokens (draft_rank < TOP_K; ties: lower id "
           f"first); the standard rule min(1, p/q) decides the others")
    return [f"Scope (what the rule was scored with, and keeps here): the rule decides {who};",
            f"  {scope.get('block_size')} drafted tokens per target call (a constant draft "
            f"length); temperature {'not recorded' if t is None else repr(t)} on both "
            "models with no top-k or top-p truncation."]
