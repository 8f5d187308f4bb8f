"""What the serving-engine formats add to the torch ``threshold``/``accept``.

``hf``: a drop-in for transformers' ``_speculative_sampling`` (assisted
generation with ``do_sample=True``): same arguments, same return values
(``valid_tokens`` of shape [1, n_matches + 1] and ``n_matches``); the rule
decides each drafted token from features computed on the probability tensors,
and on a rejection the next token is drawn from norm(max(0, p - q)) (from p
where that residual has no mass). ``install()`` puts it where
``GenerationMixin._assisted_decoding`` looks it up,
``transformers.generation.utils._speculative_sampling``, a private function whose
parameters change between releases: ``install()`` reads the installed release's
signature and installs an adapter with exactly those parameters, or refuses a
signature it does not know in one line (``tests/test_hf_releases.py`` runs the
drop-in under transformers 4.56, 5.17 and the newest release).

``vllm``: the rule over [num_tokens] tensors for the accept line of vLLM's
rejection sampler (``rejection_random_sample_kernel`` in
``vllm/v1/sample/rejection_sampler.py`` accepts where ``target_prob /
draft_prob >= uniform_prob``): the features of every drafted token from the
sampler's own tensors (draft token ids, draft and target probabilities,
cumulative drafted tokens per request), the thresholds, and the decisions.
The sequence position is not among those tensors, so a rule that reads
``position`` cannot be exported to this format.

The texts below are the fixed part of those modules; the rule itself is
generated (``evolve.export.arrays``). Neither imports anything of this project.
"""

from __future__ import annotations

from evolve.data.decode import RESIDUAL_EPS     # written into the generated code as a literal

# Inputs each format can compute from what its engine hands over.
PROVIDES = {
    "numpy": None,     # None: every input is an argument
    "torch": None,
    "hf": ("draft_prob", "target_prob", "position", "draft_entropy", "target_entropy",
           "top_token_match", "block_position", "p_max", "q_max"),
    "vllm": ("draft_prob", "target_prob", "draft_entropy", "target_entropy",
             "top_token_match", "block_position", "p_max", "q_max"),
    # what rejection_random_sample_kernel holds at its accept test (evolve.export.vllm_patch)
    "vllm-patch": ("draft_prob", "target_prob", "block_position"),
}

ENTROPY = '''

def entropy(probs):
    """Entropy in nats along the last dimension (0 log 0 = 0)."""
    return -torch.special.xlogy(probs, probs).sum(dim=-1)
'''

HF = '''

RESIDUAL_EPS = {residual_eps!r}
STATS = {{"calls": 0, "candidates": 0, "accepted": 0}}
_STATE = {{"prompt_length": 0, "previous": None}}
{entropy}

def candidate_features(candidate_input_ids, q, p, candidate_length, prompt_length=0):
    """The rule's inputs at each drafted position: float64 tensors of shape
    [candidate_length] (top_token_match: bool). q and p are the assistant's and the
    target's probabilities, [1, >= candidate_length, vocab]."""
    tokens = candidate_input_ids[0, -candidate_length:]
    idx = torch.arange(candidate_length, device=tokens.device)
    q = q[0, :candidate_length].double()
    p = p[0, :candidate_length].double()
    start = candidate_input_ids.shape[1] - candidate_length
    return {{
        "draft_prob": q[idx, tokens],
        "target_prob": p[idx, tokens],
        "position": (start + idx - int(prompt_length)).clamp(min=0).double(),
        "draft_entropy": entropy(q),
        "target_entropy": entropy(p),
        "top_token_match": tokens == p.argmax(dim=-1),
        "block_position": idx.double(),
        "p_max": p.max(dim=-1).values,
        "q_max": q.max(dim=-1).values,
    }}


def speculative_sampling(candidate_input_ids, candidate_logits, candidate_length, new_logits,
                         is_done_candidate=False, assistant_ensemble_weight=None):
    """Drop-in for transformers.generation.utils._speculative_sampling: the same
    arguments and return values (valid_tokens [1, n_matches + 1], n_matches); drafted
    tokens are kept while u < threshold, then the next token comes from
    norm(max(0, p - q)) at the first rejection (from p after the last draft). When
    every draft is kept and the candidate is done (an end-of-sequence token or the
    maximum length), no token is added, as transformers does. install() calls it
    with the arguments the installed transformers release passes (SIGNATURES)."""
    if assistant_ensemble_weight is not None:
        raise ValueError("assistant_ensemble_weight: the exported rule replaces the "
                         "acceptance test; leave it unset")
    new_candidate_input_ids = candidate_input_ids[:, -candidate_length:]
    q = candidate_logits.softmax(dim=-1)
    p = new_logits.softmax(dim=-1)
    f = candidate_features(candidate_input_ids, q, p, candidate_length,
                           _STATE["prompt_length"])
    u = torch.rand(candidate_length, dtype=torch.float64, device=p.device)
    is_accepted = accept(u, *(f[name] for name in INPUTS))
    n_matches = ((~is_accepted).cumsum(dim=-1) < 1).sum()
    STATS["calls"] += 1
    STATS["candidates"] += int(candidate_length)
    if is_done_candidate and n_matches == candidate_length:
        STATS["accepted"] += int(n_matches)
        n_matches -= 1
        return new_candidate_input_ids[:, : n_matches + 1], n_matches
    gamma = candidate_logits.shape[1]
    p_n_plus_1 = p[:, n_matches, :]
    if n_matches < gamma:
        p_prime = torch.clamp(p_n_plus_1 - q[:, n_matches, :], min=0)
        mass = p_prime.sum()
        p_prime = p_prime / mass if mass > RESIDUAL_EPS else p_n_plus_1
    else:
        p_prime = p_n_plus_1
    t = torch.multinomial(p_prime, num_samples=1).squeeze(1)[None, :]
    if n_matches > 0:
        valid_tokens = torch.cat((new_candidate_input_ids[:, :n_matches], t), dim=-1)
    else:
        valid_tokens = t
    STATS["accepted"] += int(n_matches)
    return valid_tokens, n_matches


# The parameters of transformers' _speculative_sampling in the releases this module
# knows: 4.56 to 5.16 pass is_done_candidate; 5.17 adds assistant_ensemble_weight
# (a keyword); later releases drop is_done_candidate. Each gets an adapter with
# exactly its parameters, so a call binds as it would to transformers' own function.
_BASE = ("candidate_input_ids", "candidate_logits", "candidate_length", "new_logits")
SIGNATURES = {{
    _BASE + ("is_done_candidate",):
        lambda ids, logits, n, new, is_done_candidate:
        speculative_sampling(ids, logits, n, new, is_done_candidate),
    _BASE + ("is_done_candidate", "assistant_ensemble_weight"):
        lambda ids, logits, n, new, is_done_candidate, assistant_ensemble_weight=None:
        speculative_sampling(ids, logits, n, new, is_done_candidate, assistant_ensemble_weight),
    _BASE + ("assistant_ensemble_weight",):
        lambda ids, logits, n, new, assistant_ensemble_weight=None:
        speculative_sampling(ids, logits, n, new, False, assistant_ensemble_weight),
}}


def adapter_for(function):
    """The drop-in with the parameters of ``function`` (transformers' own
    _speculative_sampling); ValueError in one line for a signature it does not know."""
    import inspect
    import transformers
    names = tuple(inspect.signature(function).parameters)
    if names not in SIGNATURES:
        raise ValueError(f"transformers {{transformers.__version__}}: _speculative_sampling"
                         f"{{names}} is not a signature this drop-in knows; known: "
                         + "; ".join(str(k) for k in SIGNATURES))
    return SIGNATURES[names]


def install(prompt_length=0):
    """Use this rule in transformers' assisted generation
    (model.generate(..., assistant_model=..., do_sample=True)). prompt_length: the
    prompt's tokens (the position input counts generated tokens from there)."""
    import transformers.generation.utils as generation_utils
    if not hasattr(generation_utils, "_speculative_sampling"):
        raise RuntimeError("this transformers version has no "
                           "generation.utils._speculative_sampling to replace")
    original = _STATE["previous"] or generation_utils._speculative_sampling
    dropin = adapter_for(original)
    _STATE["previous"] = original
    _STATE["prompt_length"] = int(prompt_length)
    generation_utils._speculative_sampling = dropin


def uninstall():
    """Put transformers' own _speculative_sampling back."""
    import transformers.generation.utils as generation_utils
    if _STATE["previous"] is not None:
        generation_utils._speculative_sampling = _STATE["previous"]
        _STATE["previous"] = None
'''

VLLM = '''
{entropy}

def token_features(draft_token_ids, draft_probs, target_probs, cu_num_draft_tokens):
    """The rule's inputs of every drafted token, [num_tokens] tensors in target_probs'
    dtype (top_token_match: bool), from the tensors of vLLM's rejection sampler:
    draft_token_ids [num_tokens]; draft_probs [num_tokens, vocab], or None for a draft
    without probabilities (q is then one-hot at the drafted token); target_probs
    [num_tokens, vocab]; cu_num_draft_tokens [batch_size], the cumulative drafted
    tokens per request. position is not among them (the rule does not read it)."""
    p = target_probs
    ids = draft_token_ids.to(device=p.device, dtype=torch.long)
    idx = torch.arange(ids.shape[0], device=p.device)
    cu = cu_num_draft_tokens.to(device=p.device, dtype=torch.long)
    req = torch.searchsorted(cu, idx, right=True)
    start = torch.where(req > 0, cu[(req - 1).clamp(min=0)], torch.zeros_like(req))
    ones = torch.ones(ids.shape[0], dtype=p.dtype, device=p.device)
    if draft_probs is None:
        draft_prob, draft_entropy, q_max = ones, ones * 0, ones
    else:
        q = draft_probs.to(p.dtype)
        draft_prob, draft_entropy, q_max = q[idx, ids], entropy(q), q.max(dim=-1).values
    return {{
        "draft_prob": draft_prob,
        "target_prob": p[idx, ids],
        "position": ones * 0,
        "draft_entropy": draft_entropy,
        "target_entropy": entropy(p),
        "top_token_match": ids == p.argmax(dim=-1),
        "block_position": (idx - start).to(p.dtype),
        "p_max": p.max(dim=-1).values,
        "q_max": q_max,
    }}


def thresholds(draft_token_ids, draft_probs, target_probs, cu_num_draft_tokens):
    """The rule's threshold of every drafted token, [num_tokens]."""
    f = token_features(draft_token_ids, draft_probs, target_probs, cu_num_draft_tokens)
    return threshold(*(f[name] for name in INPUTS))


def accepted(uniform_probs, draft_token_ids, draft_probs, target_probs, cu_num_draft_tokens):
    """The accept line over [num_tokens] tensors: uniform_probs < threshold (bool)."""
    h = thresholds(draft_token_ids, draft_probs, target_probs, cu_num_draft_tokens)
    return uniform_probs.to(h.device) < h
'''


def engine_source(fmt: str) -> str:
    """The fixed text a format appends to the torch rule ('' for numpy and torch)."""
    if fmt == "hf":
        return HF.format(residual_eps=RESIDUAL_EPS, entropy=ENTROPY)
    if fmt == "vllm":
        return VLLM.format(entropy=ENTROPY)
    return ""
