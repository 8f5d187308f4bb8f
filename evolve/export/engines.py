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

# written into the generated code as literals
from evolve.data import vocab_class as VC
from evolve.data.decode import KL_FLOOR, RESIDUAL_EPS
from evolve.export.formats import ENGINE_FORMATS, FORMATS, provides, reads
from evolve.lang.features import BY_NAME, INPUT_NAMES, LOOKAHEAD_INPUT_NAMES

# Inputs each format can compute from what its engine hands over (``evolve.export.formats``:
# the registry's expressions over the tensors its glue holds). The transformers drop-in and
# the vLLM module see both full distributions of every drafted position and the block they
# belong to, so they compute the slot features and the lookahead inputs as the decoders do
# (``evolve.data.inputs``); vLLM's kernel holds one token's probabilities only.
PROVIDES = {name: provides(name) for name in FORMATS}


def engine_inputs(engine: str, objective: str, lookahead: bool = False) -> str:
    """The inputs (comma-separated, for ``Config.inputs``) a search for ``engine`` may
    use: those its export format computes (``PROVIDES``), the token features only when
    the run's ``objective`` scores token splits, the lookahead inputs only with
    ``lookahead`` (the run offers them), and an input of another world's own group
    (the task world's answer inputs) only where the objective's data offer it; the
    inputs only some traces hold (the slot features, the target's rank, the token's
    class) are named with a ``?``: used where the run's data offer them."""
    from evolve.lang.features import offered    # lazy: start-up (as below)
    from evolve.objectives import OBJECTIVES     # lazy: start-up (export modules load alone)
    if engine not in ENGINE_FORMATS:
        raise ValueError(f"unknown engine {engine!r}")
    obj = OBJECTIVES.get(objective)
    traces = obj is None or obj.trace_inputs      # an unknown objective is refused by Config
    extra = tuple(obj.extra_groups) if obj is not None else ()
    data = offered(bool(traces), False, False, extra)
    some = set(offered(bool(traces), True, True, extra + ("vocab",), ranks=True)) - set(data)
    names = PROVIDES[ENGINE_FORMATS[engine]]
    return ",".join(n + ("?" if n in some else "") for n in names
                    if (n in data or n in some) and (traces or n in INPUT_NAMES)
                    and (lookahead or n not in LOOKAHEAD_INPUT_NAMES))


# What an engine's glue reads itself besides the rule's inputs: the vLLM module's scope
# (the standard rule past BLOCK_SIZE, and outside the top-k) reads these three
GLUE_READS = {"vllm": ("draft_prob", "target_prob", "block_position")}


def features_source(fmt: str, inputs: tuple, indent: str = "    ") -> str:
    """The glue's dict of the rule's inputs (``inputs``: the module's INPUTS) and of what
    the glue reads itself (``GLUE_READS``), each from its registry expression; an input
    of the signature that the engine does not hold (the rule does not read it:
    ``check_format``) is zeros."""
    held = PROVIDES[fmt]
    lines = [f"{indent}f = {{"]
    for name in dict.fromkeys(tuple(inputs) + GLUE_READS.get(fmt, ())):
        expr = BY_NAME[name].engine if name in held else "torch.zeros_like(block)"
        note = "" if name in held else "   # not held by this engine; the rule does not read it"
        lines.append(f'{indent}    "{name}": {expr},{note}')
    lines.append(f"{indent}}}")
    return "\n".join(lines)


def needs_slots(fmt: str, inputs: tuple) -> bool:
    """Whether the glue computes the slot features (an input of the rule reads them)."""
    held = PROVIDES[fmt] or ()
    return any("slots" in reads(BY_NAME[n].engine) for n in inputs if n in held)


ENTROPY = '''

def entropy(probs):
    """Entropy in nats along the last dimension (0 log 0 = 0)."""
    return -torch.special.xlogy(probs, probs).sum(dim=-1)


KL_FLOOR = {kl_floor!r}
NEEDS_SLOTS = {needs_slots!r}   # the rule reads an input computed from the slot features


def kl(a, b):
    """KL(a || b) along the last dimension, over a's support, b floored at KL_FLOOR."""
    pos = a > 0
    one, zero = torch.ones_like(a), torch.zeros_like(a)
    t = torch.where(pos, a * (torch.log(torch.where(pos, a, one))
                              - torch.log(torch.clamp(b, min=KL_FLOOR))), zero)
    return t.sum(dim=-1)


def slot_features(p, q, later, steps):
    """The slot features of drafted positions from their full distributions p, q
    [n, vocab] (float64): slot_tv = sum max(0, q - p) (the standard rule's rejection
    probability), KL(p || q) and KL(q || p); and the lookahead inputs along each
    block, where later [n] (bool) says position i + 1 is the next slot of position
    i's block and steps bounds a block's length: next_tv, the next slot's TV (0 at a
    block's last), and ahead, the expected number of later drafts the standard rule
    accepts after an acceptance, ahead_i = (1 - TV_(i+1)) (1 + ahead_(i+1))."""
    tv = torch.clamp(q - p, min=0).sum(dim=-1)
    zero = torch.zeros_like(tv)
    nxt = zero.clone()
    nxt[:-1] = torch.where(later[:-1], tv[1:], zero[1:])
    ahead = zero.clone()
    for _ in range(int(steps)):
        after = zero.clone()
        after[:-1] = ahead[1:]
        ahead = torch.where(later, (1.0 - nxt) * (1.0 + after), zero)
    return {{"slot_tv": tv, "slot_kl_pq": kl(p, q), "slot_kl_qp": kl(q, p), "next_tv": nxt,
            "ahead": ahead}}
'''

HF = '''

RESIDUAL_EPS = {residual_eps!r}
STATS = {{"calls": 0, "candidates": 0, "accepted": 0, "short_blocks": 0}}
_STATE = {{"prompt_length": 0, "previous": None, "configs": []}}
NEEDS_CLASSES = {needs_classes!r}   # the rule reads token_class: install(..., tokenizer=...)
_CLASSES = {{"table": None, "tensor": None}}
{entropy}

# The class of each token of the vocabulary (0 word, 1 number, 2 punctuation, 3 other),
# computed from the tokenizer as the traces the rule was scored on computed it.
{vocab_source}


def use_tokenizer(tokenizer):
    """The tokenizer whose vocabulary's classes the token_class input reads."""
    _CLASSES["table"] = tokenizer_table(tokenizer, len(tokenizer))
    _CLASSES["tensor"] = None


def token_classes(vocab, device):
    """The classes of the ids 0 .. vocab - 1 (ids past the tokenizer's: 3, other)."""
    table = _CLASSES["table"]
    if table is None:
        raise ValueError("the rule reads token_class, the class of each token of the "
                         "vocabulary: pass install(..., tokenizer=...) (or generate(..., "
                         "tokenizer=...))")
    t = _CLASSES["tensor"]
    if t is None or t.shape[0] != vocab or t.device != torch.device(device):
        t = torch.tensor((table + [3] * vocab)[:vocab], dtype=torch.float64, device=device)
        _CLASSES["tensor"] = t
    return t


def candidate_features(candidate_input_ids, q, p, candidate_length, prompt_length=0):
    """The rule's inputs at each drafted position: float64 tensors of shape
    [candidate_length] (top_token_match: bool), and draft_rank (the drafted token's
    rank under q, for the scope). q and p are the assistant's and the target's
    probabilities, [1, >= candidate_length, vocab]."""
    x = candidate_input_ids[0, -candidate_length:]
    rows = torch.arange(candidate_length, device=x.device)
    q = q[0, :candidate_length].double()
    p = p[0, :candidate_length].double()
    start = candidate_input_ids.shape[1] - candidate_length
    position = (start + rows - int(prompt_length)).clamp(min=0).double()
    block = rows.double()
    # the call's drafts are one block
    slots = slot_features(p, q, rows + 1 < candidate_length, candidate_length) \
        if NEEDS_SLOTS else {{}}
    classes = token_classes(p.shape[-1], p.device) if NEEDS_CLASSES else None
{features}
    f["draft_rank"] = draft_rank(q, x) if TOP_K is not None else torch.zeros_like(rows)
    return f


def speculative_sampling(candidate_input_ids, candidate_logits, candidate_length, new_logits,
                         is_done_candidate=False, assistant_ensemble_weight=None):
    """Drop-in for transformers.generation.utils._speculative_sampling: the same
    arguments and return values (valid_tokens [1, n_matches + 1], n_matches); drafted
    tokens are kept while u < acceptance (the rule inside its scope, the standard
    rule outside it), then the next token comes from norm(max(0, p - q)) at the first
    rejection (from p after the last draft). When every draft is kept and the
    candidate is done (an end-of-sequence token or the maximum length), no token is
    added, as transformers does. install() calls it with the arguments the installed
    transformers release passes (SIGNATURES). More drafted tokens than BLOCK_SIZE is
    an error: the rule was not scored on them."""
    if assistant_ensemble_weight is not None:
        raise ValueError("assistant_ensemble_weight: the exported rule replaces the "
                         "acceptance test; leave it unset")
    if BLOCK_SIZE is not None and int(candidate_length) > BLOCK_SIZE:
        raise ValueError(f"the assistant drafted {{int(candidate_length)}} tokens; the rule "
                         f"was scored on blocks of {{BLOCK_SIZE}}: install(model, "
                         f"assistant_model) sets num_assistant_tokens={{BLOCK_SIZE}}, a "
                         f"constant schedule and no confidence cut-off")
    new_candidate_input_ids = candidate_input_ids[:, -candidate_length:]
    q = candidate_logits.softmax(dim=-1)
    p = new_logits.softmax(dim=-1)
    f = candidate_features(candidate_input_ids, q, p, candidate_length,
                           _STATE["prompt_length"])
    u = torch.rand(candidate_length, dtype=torch.float64, device=p.device)
    inputs = [f[name] for name in INPUTS]
    is_accepted = (accept(u, *inputs, draft_rank=f["draft_rank"]) if SCOPE is not None
                   else accept(u, *inputs))
    n_matches = ((~is_accepted).cumsum(dim=-1) < 1).sum()
    STATS["calls"] += 1
    STATS["candidates"] += int(candidate_length)
    if BLOCK_SIZE is not None and int(candidate_length) < BLOCK_SIZE:
        STATS["short_blocks"] += 1            # near the maximum length
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


# How the rule was scored, as generation-config values: the assistant drafts
# BLOCK_SIZE tokens per call (constant schedule, no confidence cut-off), and both
# models' logits are divided by TEMPERATURE with no top-k or top-p truncation (the
# assistant's candidates use the target's logits processors).
DRAFTING = {{"num_assistant_tokens": BLOCK_SIZE, "num_assistant_tokens_schedule": "constant",
            "assistant_confidence_threshold": 0.0}}
SAMPLING = {{"do_sample": True, "temperature": TEMPERATURE, "top_k": 0, "top_p": 1.0,
            "min_p": None, "typical_p": 1.0, "epsilon_cutoff": 0.0, "eta_cutoff": 0.0}}
# Target settings that change p and that the rule was not scored with: refused.
CHANGES_P = {{"repetition_penalty": (None, 1.0), "no_repeat_ngram_size": (None, 0),
             "bad_words_ids": (None,), "suppress_tokens": (None,), "sequence_bias": (None,),
             "encoder_repetition_penalty": (None, 1.0)}}
PINNED = set(DRAFTING) | set(SAMPLING)


def _pin(config, values):
    old = {{k: getattr(config, k, None) for k in values}}
    _STATE["configs"].append((config, old))
    for k, v in values.items():
        setattr(config, k, v)


def _restore():
    while _STATE["configs"]:
        config, old = _STATE["configs"].pop()
        for k, v in old.items():
            setattr(config, k, v)


def install(model=None, assistant_model=None, prompt_length=0, tokenizer=None):
    """Use this rule in transformers' assisted generation (model.generate(...,
    assistant_model=assistant_model)), decoding as the rule was scored: the
    assistant's generation config drafts BLOCK_SIZE tokens per call with a constant
    schedule and no confidence cut-off (DRAFTING), and the target's samples at
    TEMPERATURE with no top-k or top-p truncation (SAMPLING); uninstall() puts both
    back. A rule scored on traces needs both models. Keyword arguments given to
    generate() override these settings, so pass none of them (or use generate()
    below, which refuses them). prompt_length: the prompt's tokens (the position
    input counts generated tokens from there). tokenizer: the models' tokenizer, for a
    rule that reads token_class (NEEDS_CLASSES)."""
    import transformers.generation.utils as generation_utils
    if tokenizer is not None:
        use_tokenizer(tokenizer)
    if NEEDS_CLASSES and _CLASSES["table"] is None:
        raise ValueError("install(..., tokenizer=...): the rule reads token_class, the "
                         "class of each token of the models' vocabulary")
    if not hasattr(generation_utils, "_speculative_sampling"):
        raise RuntimeError("this transformers version has no "
                           "generation.utils._speculative_sampling to replace")
    if SCOPE is not None and (model is None or assistant_model is None):
        raise ValueError(f"install(model, assistant_model): the rule was scored at a constant "
                         f"draft length of {{BLOCK_SIZE}} and temperature {{TEMPERATURE}}, "
                         f"which install sets on the two models' generation configs")
    if SCOPE is not None:
        bad = next(((k, getattr(model.generation_config, k, None))
                    for k, ok in CHANGES_P.items()
                    if getattr(model.generation_config, k, None) not in ok), None)
        if bad is not None:
            raise ValueError(f"model.generation_config.{{bad[0]}} is {{bad[1]!r}}: it changes "
                             f"the target's distribution, which the rule was not scored with")
    original = _STATE["previous"] or generation_utils._speculative_sampling
    dropin = adapter_for(original)
    _restore()
    if SCOPE is not None:
        _pin(assistant_model.generation_config, DRAFTING)
        _pin(model.generation_config, SAMPLING)
    _STATE["previous"] = original
    _STATE["prompt_length"] = int(prompt_length)
    generation_utils._speculative_sampling = dropin


def uninstall():
    """Put transformers' own _speculative_sampling and the models' settings back."""
    import transformers.generation.utils as generation_utils
    _restore()
    if _STATE["previous"] is not None:
        generation_utils._speculative_sampling = _STATE["previous"]
        _STATE["previous"] = None


def generate(model, assistant_model, input_ids, tokenizer=None, **kwargs):
    """model.generate(input_ids, assistant_model=assistant_model, **kwargs) with this
    rule and the settings it was scored with (install, generate, uninstall);
    keyword arguments that would change those settings are refused (tokenizer: as
    for install)."""
    bad = sorted(set(kwargs) & PINNED)
    if bad:
        raise ValueError(f"generate: {{bad[0]}} is set by the rule's scope; leave it out")
    install(model, assistant_model, prompt_length=input_ids.shape[-1], tokenizer=tokenizer)
    try:
        return model.generate(input_ids, assistant_model=assistant_model, **kwargs)
    finally:
        uninstall()
'''

VLLM = '''
{entropy}

def token_features(draft_token_ids, draft_probs, target_probs, cu_num_draft_tokens):
    """The rule's inputs of every drafted token, [num_tokens] tensors in target_probs'
    dtype (top_token_match: bool), and draft_rank (the drafted token's rank under q,
    for the scope), from the tensors of vLLM's rejection sampler: draft_token_ids
    [num_tokens]; draft_probs [num_tokens, vocab], or None for a draft without
    probabilities (q is then one-hot at the drafted token, which is then rank 0);
    target_probs [num_tokens, vocab]; cu_num_draft_tokens [batch_size], the cumulative
    drafted tokens per request. position is not among them (the rule does not read it)."""
    p = target_probs
    x = draft_token_ids.to(device=p.device, dtype=torch.long)
    rows = torch.arange(x.shape[0], device=p.device)
    cu = cu_num_draft_tokens.to(device=p.device, dtype=torch.long)
    req = torch.searchsorted(cu, rows, right=True)
    start = torch.where(req > 0, cu[(req - 1).clamp(min=0)], torch.zeros_like(req))
    if draft_probs is None:            # a drafter without probabilities: q one-hot
        q = torch.nn.functional.one_hot(x, p.shape[-1]).to(p.dtype)
        rank = torch.zeros_like(x)
    else:
        q = draft_probs.to(p.dtype)
        rank = draft_rank(draft_probs, x) if TOP_K is not None else torch.zeros_like(x)
    block = (rows - start).to(p.dtype)
    slots = {{}}
    if NEEDS_SLOTS:
        later = torch.zeros_like(x, dtype=torch.bool)
        later[:-1] = req[1:] == req[:-1]          # the next token is the same request's
        if BLOCK_SIZE is not None:                # and within the scored block
            later &= rows - start + 1 < BLOCK_SIZE
        steps = int((rows - start).max()) + 1 if x.shape[0] else 0
        slots = {{k: v.to(p.dtype)
                 for k, v in slot_features(p.double(), q.double(), later, steps).items()}}
{features}
    f["draft_rank"] = rank
    return f


def thresholds(draft_token_ids, draft_probs, target_probs, cu_num_draft_tokens):
    """The acceptance probability of every drafted token, [num_tokens], as the rule was
    scored: the rule for drafts among the draft's top TOP_K at block positions below
    BLOCK_SIZE, the standard rule min(1, p/q) for the others (a rule with no scope:
    its threshold)."""
    f = token_features(draft_token_ids, draft_probs, target_probs, cu_num_draft_tokens)
    inputs = [f[name] for name in INPUTS]
    if SCOPE is None:
        return threshold(*inputs)
    a = acceptance(f["draft_rank"], *inputs)
    if BLOCK_SIZE is None:
        return a
    q, p = f["draft_prob"].to(a.dtype), f["target_prob"].to(a.dtype)
    std = torch.where(q > 0, torch.clamp(p / q, max=1.0), torch.zeros_like(q))
    return torch.where(f["block_position"] < BLOCK_SIZE, a, std)


def accepted(uniform_probs, draft_token_ids, draft_probs, target_probs, cu_num_draft_tokens):
    """The accept line over [num_tokens] tensors: uniform_probs < thresholds (bool)."""
    h = thresholds(draft_token_ids, draft_probs, target_probs, cu_num_draft_tokens)
    return uniform_probs.to(h.device) < h
'''


def settings_lines(fmt: str, scope: dict | None) -> list[str]:
    """Header lines: the engine settings that decode as the rule was scored."""
    if scope is None:
        return []
    g, t = scope.get("block_size"), scope.get("temperature")
    temp = "the traces' temperature (not recorded)" if t is None else f"temperature={t!r}"
    engine = FORMATS[fmt].engine
    if engine == "transformers":
        return ["transformers: install(model, assistant_model) sets "
                f"assistant_model.generation_config.num_assistant_tokens={g},",
                "  num_assistant_tokens_schedule='constant', assistant_confidence_threshold=0.0 "
                f"and model.generation_config do_sample=True, {temp}, top_k=0, top_p=1.0",
                "  (or call generate(model, assistant_model, input_ids, ...), which also "
                "uninstalls)."]
    if engine == "vllm":
        return [f"vLLM: serve with num_speculative_tokens={g} (a draft model or EAGLE "
                f"drafter that gives probabilities) and sample with {temp}, top_k and "
                "top_p off; drafts at block positions >= "
                f"{g} are decided by the standard rule."]
    return [f"Deploy it at a constant draft length of {g} tokens per target call, {temp} "
            "on both models, no top-k or top-p truncation."]


def _entropy(needs: bool) -> str:
    return ENTROPY.format(kl_floor=KL_FLOOR, needs_slots=needs)


def engine_source(fmt: str, inputs: tuple = ()) -> str:
    """The fixed text a format appends to the torch rule ('' for numpy and torch), with
    the dict of the rule's ``inputs`` (its signature) from the registry's expressions."""
    if fmt == "hf":
        return HF.format(residual_eps=RESIDUAL_EPS, entropy=_entropy(needs_slots(fmt, inputs)),
                         features=features_source(fmt, inputs),
                         needs_classes="token_class" in inputs, vocab_source=VC.SOURCE.strip())
    if fmt == "vllm":
        return VLLM.format(entropy=_entropy(needs_slots(fmt, inputs)),
                           features=features_source(fmt, inputs))
    return ""
