"""A task with your own Hugging Face pair and task file.

``evolve data task --task-file FILE --target PATH_OR_ID --draft PATH_OR_ID``: the
problems of a task file (``files``: JSON lines, ``prompt``, ``answer``, optional
``split``) decoded by the pair, greedily or by sampling, each until the target's
end-of-text token or ``max_new_tokens`` generated tokens, and the final answer read
from the generated text alone (never the prompt) by a checker (``checker``: the
line after the last ``delimiter``, GSM8K's ``####``, a regular expression's
group, or with ``answer_words`` the answer of any problem of the file that the text
names last, for answers written in a sentence). Problems without a split are dealt out train, valid, train, test after a
seeded shuffle (2 : 1 : 1), as the Hugging Face prompts are.

``HFTaskPair`` has the built-in pair's interface (``pair.TaskPair``), so the
recorder, label miner and arbiter (``evolve.freerun.task_compare``) run on it. Each model is
a ``ModelView``: ``probs(H)`` on (B, C) int32 histories, left-padded with ``PAD`` =
-1 (no token), is the model's next-token distribution after each history's tokens,
padding masked (attention mask and positions counted from the first token), softmax
at the temperature in float64 as the Hugging Face trace source computes it
(``evolve.data.sources.hf.device``). A view reads the whole history each call: the
reference. The pair decodes with the KV-cached Hugging Face recorder
(``HFTaskPair.decode``, the interface of ``evolve.data.decode.decode``) and mines
with cached continuations (``continuation_reader``), both tested against the views. The
models load as the Hugging Face trace source loads them
(``evolve.data.sources.hf.models``: safetensors only, no code from the model
directory, both tokenizers alike).

The task file and local model directories are recorded as absolute paths, so
``evolve simulate-task`` finds them from any directory.

C, the context both models read, is set from the problems: the longest prompt in
tokens, ``max_new_tokens`` and a block of drafts, so every model always reads the
whole prompt; it must fit the models' positions. On one device, dtype and batch
size the recorded files are byte-identical for the same configuration.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from types import SimpleNamespace

import numpy as np

from evolve.data import labels as LB
from evolve.data import vocab_class as VC
from evolve.data.decode import batch_ticks
from evolve.data.sources import ngram
from evolve.data.sources.hf import HFTraceConfig
from evolve.data.sources.hf import decode as hf_decode
from evolve.data.sources.hf.cache import Cached, Layout, prefill_shared
from evolve.data.sources.hf import device as DV
from evolve.data.sources.hf import models as HM
from evolve.data.sources.task.checker import (CheckerError, DelimiterChecker, RegexChecker,
                                              cut_at_stop, stop_problem, WordChecker)
from evolve.data.sources.task.files import by_split, read_tasks
from evolve.data.tokens import SPLITS, DataError
from evolve.io.atomic import sha256_file

PAD = -1                     # left padding of histories (traces.CONTEXT_PAD)
MAX_NEW_TOKENS = 1 << 16
MAX_ROWS = 1024              # histories a model reads in one forward pass
COMPACT = 0.75               # mining drops ended rows once at most this share is live


@dataclass(frozen=True)
class HFTaskConfig(ngram.ConfigFields):
    """Everything a task recorded with a Hugging Face pair depends on."""
    target: str
    draft: str
    task_file: str
    seed: int = 0                      # the split of unlabelled problems, and decoding
    block_size: int = 4
    top_k: int = 16
    temperature: float = 1.0
    max_new_tokens: int = 256          # generated tokens per problem at most
    delimiter: str | None = "####"     # the answer: the line after the last delimiter,
    answer_regex: str | None = None    # or a regular expression's group,
    answer_words: bool = False         # or the task's answer named last (one of the three)
    train_prompts: int | None = None   # the first problems of each split (None: all)
    valid_prompts: int | None = None
    test_prompts: int | None = None
    device: str = "cpu"
    dtype: str = "float32"
    batch_size: int = 16               # problems decoded together
    context_len: int = 0               # set from the problems (``build_pair``)
    task_sha256: str = ""              # the task file's checksum, set when built
    stop: tuple = ()                   # stop strings: a text ends where one starts

    def __post_init__(self):
        if isinstance(self.stop, list):          # read back from meta.json
            object.__setattr__(self, "stop", tuple(self.stop))

    def validate(self) -> None:
        need = self.need
        for f in fields(self):          # a config read back from a file may hold anything
            v = getattr(self, f.name)
            if f.name == "temperature":
                need(isinstance(v, (int, float)) and not isinstance(v, bool)
                     and math.isfinite(v), f.name, "expected a finite number")
            elif f.name in ("target", "draft", "task_file", "device", "dtype"):
                need(isinstance(v, str) and v != "", f.name, "expected a non-empty string")
            elif f.name in ("delimiter", "answer_regex"):
                need(v is None or isinstance(v, str), f.name, "expected a string or none")
            elif f.name == "task_sha256":
                need(isinstance(v, str), f.name, "expected a string")
            elif f.name == "stop":
                why = stop_problem(v)
                need(not why, f.name, why)
            elif f.name == "answer_words":
                need(isinstance(v, bool), f.name, "expected true or false")
            else:
                need((v is None and f.name.endswith("_prompts"))
                     or (isinstance(v, int) and not isinstance(v, bool)), f.name,
                     "expected a whole number")
        need(0 <= self.seed < 2 ** 63, "seed", "expected an integer >= 0")
        need(self.temperature > 0, "temperature", "expected > 0")
        need(1 <= self.block_size <= 64, "block_size", "expected 1..64")
        need(1 <= self.top_k <= 1 << 20, "top_k", "expected 1..1,048,576")
        need(1 <= self.max_new_tokens <= MAX_NEW_TOKENS, "max_new_tokens",
             f"expected 1..{MAX_NEW_TOKENS:,}")
        need(1 <= self.batch_size <= ngram.MAX_PROMPTS, "batch_size",
             f"expected 1..{ngram.MAX_PROMPTS:,}")
        need(self.device in HM.DEVICES, "device", "expected one of " + ", ".join(HM.DEVICES))
        need(self.dtype in HM.DTYPES, "dtype", "expected one of " + ", ".join(HM.DTYPES))
        need(self.context_len >= 0, "context_len", "expected >= 0")
        for s in SPLITS:
            v = getattr(self, f"{s}_prompts")
            need(v is None or 1 <= v <= ngram.MAX_PROMPTS, f"{s}_prompts",
                 f"expected 1..{ngram.MAX_PROMPTS:,} or none (every problem of the split)")
        given = [self.delimiter is not None, self.answer_regex is not None, self.answer_words]
        need(sum(given) == 1, "answer_regex" if self.answer_regex is not None
             else "answer_words", "give a delimiter, an answer regex or answer words, one "
             "of the three")
        if not self.answer_words:
            self.checker()

    def checker(self, problems=()):
        """The answer checker the configuration names (TraceConfigError naming the
        setting if it cannot work); answer words look for the answers of ``problems``
        (every problem of the task file)."""
        try:
            if self.answer_words:
                return WordChecker(p.answer for p in problems)
            if self.answer_regex is not None:
                return RegexChecker(self.answer_regex)
            return DelimiterChecker(self.delimiter)
        except CheckerError as e:
            field = ("answer_words" if self.answer_words else "answer_regex"
                     if self.answer_regex is not None else "delimiter")
            raise ngram.TraceConfigError(field, str(e).split(": ", 1)[-1]) from None

    def checker_text(self) -> str:
        if self.answer_words:
            return "words (the task's answer named last, as whole words)"
        return (f"regex {self.answer_regex!r}" if self.answer_regex is not None
                else f"{self.delimiter} (the last delimiter's line)")

    def trace_config(self):
        """The Hugging Face trace configuration that loads these models
        (``evolve.data.sources.hf.models.load_pair``)."""
        return HFTraceConfig(target=self.target, draft=self.draft, seed=self.seed,
                             block_size=self.block_size, top_k=self.top_k,
                             temperature=self.temperature, device=self.device,
                             dtype=self.dtype, batch_size=self.batch_size)


class ModelView:
    """One model as the task decoder asks for it: ``probs(H)``, the next-token
    distribution (float64, (B, vocab)) after each of the (B, C) histories H (token
    ids, left-padded with PAD)."""

    def __init__(self, model, vocab: int, temperature: float, device: str, name: str,
                 info: dict):
        self.model, self.vocab, self.temperature = model, vocab, temperature
        self.device, self.name, self.info = device, name, info

    def probs(self, H) -> np.ndarray:
        import torch  # lazy: the core install has no torch
        H = np.asarray(H)
        out = []
        for s in range(0, H.shape[0], MAX_ROWS):
            h = H[s:s + MAX_ROWS]
            live = h != PAD
            first = int(np.argmax(live.any(axis=0)))      # columns before it: all padding
            h, live = h[:, first:], live[:, first:]
            ids = torch.as_tensor(np.where(live, h, 0), dtype=torch.long, device=self.device)
            mask = torch.as_tensor(live, dtype=torch.long, device=self.device)
            pos = (mask.cumsum(1) - 1).clamp_min(0)
            with torch.inference_mode():
                logits = self.model(input_ids=ids, attention_mask=mask,
                                    position_ids=pos).logits[:, -1]
                out.append(DV.probs(logits, self.vocab, self.temperature).cpu().numpy())
        return np.concatenate(out) if out else np.zeros((0, self.vocab))

    def describe(self) -> dict:
        return self.info


@dataclass
class HFTaskPair:
    """A user's draft/target pair on a user's task (the interface of ``pair.TaskPair``)."""
    target: ModelView
    draft: ModelView
    tokenizer: object
    problems: dict                   # split -> list of files.Problem
    config: HFTaskConfig
    vocab: int
    info: dict
    end: int | None                  # the end-of-text token (None: the budget ends texts)
    checker: object

    token_dtype = np.int32
    pad = PAD
    # mining reads each prefix its histories share once (False: each history whole, the
    # reference benchmarks/speed/mining_prefixes.py times it against)
    share_prefixes = True

    @property
    def context_len(self) -> int:
        return self.config.context_len

    @property
    def max_tokens(self) -> int:
        return self.config.max_new_tokens

    @property
    def batch(self) -> int:
        return self.config.batch_size

    def encode(self, text: str) -> list:
        return list(self.tokenizer(text)["input_ids"])

    def prompts(self, split: str, n: int | None = None):
        """(the first n prompts of a split as token ids, left-padded with PAD to
        (n, context_len) int32; one numpy Generator per prompt for the uniforms)."""
        problems = self.problems[split][:n]
        H = np.full((len(problems), self.context_len), PAD, dtype=np.int32)
        for i, p in enumerate(problems):
            ids = self.encode(p.prompt)
            H[i, self.context_len - len(ids):] = ids
        children = (np.random.SeedSequence([self.config.seed, 2]).spawn(len(SPLITS))
                    [SPLITS.index(split)].spawn(len(problems)))
        return H, [np.random.default_rng(c) for c in children]

    def max_new(self, split: str) -> int:
        """Blocks to decode at most: every block emits a token, and the budget of
        ``max_new_tokens`` generated tokens ends a text first."""
        return self.config.max_new_tokens

    def _text(self, tokens) -> list:
        t = [int(x) for x in tokens if int(x) != PAD]
        if self.end is not None and self.end in t:
            t = t[:t.index(self.end)]
        return t

    def body(self, tokens) -> str:
        """Generated tokens before the end-of-text token, as text, cut at the first stop
        string."""
        return cut_at_stop(self.tokenizer.decode(self._text(tokens), skip_special_tokens=True),
                           self.config.stop)

    def answer_of(self, tokens):
        """The final answer of a generated text (tokens), None when it has none."""
        return self.checker.extract(self.body(tokens))

    def done_of(self, tokens) -> bool:
        """Whether a generated text has ended: the end-of-text token, or a stop string
        in its text."""
        if self.end is not None and self.end in list(tokens):
            return True
        if not self.config.stop:
            return False
        text = self.tokenizer.decode(self._text(tokens), skip_special_tokens=True)
        return len(cut_at_stop(text, self.config.stop)) < len(text)

    def decode(self, prompts, rngs, blocks: int, advance=None, rule=None, record: bool = True,
               history: bool = False, greedy: bool = False, end: int | None = None,
               max_tokens: int | None = None):
        """``evolve.data.decode.decode`` of this pair, KV-cached: the same arguments,
        uniforms, decisions and returned values (``prompts``: (n, C) int32 left-padded
        with PAD; with ``history``, the (n, C + blocks (g + 1)) histories and their
        lengths), decoded by the Hugging Face recorder (``evolve.data.sources.hf.decode``)
        on the models' device, ``advance(n)`` after each batch of n problems. The logits
        are the cached passes', equal to whole-history reads to float rounding (tested)."""
        H = np.asarray(prompts)
        ids = [h[h != PAD].astype(np.int64) for h in H]
        out = hf_decode.decode(self._raw(), ids, rngs, blocks, record=record, rule=rule,
                               greedy=greedy, end=end, max_tokens=max_tokens, history=True,
                               tick=batch_ticks(len(ids), self.batch, advance),
                               done_of=self.done_of if self.config.stop else None)
        cols, acc, hists = out
        if not history:
            return cols, acc
        C, g = H.shape[1], self.config.block_size
        full = np.full((H.shape[0], C + blocks * (g + 1)), PAD, dtype=H.dtype)
        full[:, :C] = H
        lens = np.empty(H.shape[0], dtype=np.int64)
        for i, (p, h) in enumerate(zip(ids, hists)):
            gen = np.asarray(h[len(p):])
            full[i, C:C + gen.size] = gen
            lens[i] = C + gen.size
        return cols, acc, full, lens

    def _raw(self):
        """The pair as the Hugging Face recorder reads it: the models themselves."""
        return SimpleNamespace(target=self.target.model, draft=self.draft.model,
                               vocab=self.vocab, device=self.target.device, config=self.config,
                               info={"target": self.target.info, "draft": self.draft.info},
                               _vocab_classes=VC.of_pair(self), task=self)

    def continuation_reader(self, hist, steps: int, greedy: bool):
        """How ``evolve.data.continuations.continue_text`` continues the histories ``hist``
        (B, L) over at most ``steps`` steps with the target's KV cache.
        ``next_tokens(live, h, u)`` gives the next token of each ``live`` row: the
        first call reads the live rows' histories, each shared prefix once (the rows of
        one problem continue one text: ``cache.prefill_shared``), each later call only
        the previous step's tokens (the last column of ``h``). The token is chosen on the
        device (greedy: the argmax; else the inverse-CDF draw with the uniforms ``u``,
        ``device.sample``), so only the tokens come back to the host. Rows that have
        ended leave the batch (``Cached.select``) once no more than ``COMPACT`` of its
        rows are live. The logits are the cached passes', equal to whole-history reads
        to float rounding, as the trace recorder's are."""
        import torch  # lazy: the core install has no torch
        view = self.target
        dev = view.device
        state = {}

        def next_tokens(live, h, u):
            with torch.inference_mode():
                if not state:
                    ids = [r[r != PAD].astype(np.int64) for r in np.asarray(hist)[live]]
                    got = (prefill_shared(view.model, ids, steps, dev)
                           if getattr(self, "share_prefixes", True) else None)
                    if got is None:          # a cache that cannot copy rows
                        lay, model = Layout(ids, steps, 0, dev), Cached(view.model)
                        model.prefill(lay)
                    else:
                        lay, model = got
                    lay.open_block()
                    state.update(lay=lay, model=model, rows=np.asarray(live))
                else:
                    lay, model, rows = state["lay"], state["model"], state["rows"]
                    kept = np.isin(rows, live)
                    if kept.sum() <= COMPACT * rows.size:
                        sel = torch.as_tensor(np.flatnonzero(kept), device=dev)
                        if model.select(sel):
                            lay.select(sel)
                            rows = state["rows"] = rows[kept]
                    # an ended row still in the batch reads padding: a token never used
                    lay.append(torch.as_tensor(np.maximum(h[rows, -1], 0),
                                               dtype=torch.int64, device=dev))
                logits = model.read(lay, lay.cols, 1)[:, -1]
                at = torch.as_tensor(np.searchsorted(state["rows"], live), device=dev)
                P = DV.probs(logits.index_select(0, at), self.vocab, view.temperature)
                nxt = (P.argmax(dim=1) if greedy else
                       DV.sample(P, torch.as_tensor(u, dtype=torch.float64, device=dev)))
                return nxt.cpu().numpy()
        return next_tokens

    def mining_row_bytes(self, hist_len: int, steps: int) -> int:
        """An estimate of the device memory one continuation takes in mining: its KV
        cache over ``hist_len + steps`` positions (2 x layers x key/value heads x head
        size x the cache's bytes a position), a prefill's largest activations
        (``hist_len`` x (hidden + MLP) sizes) and attention scores (``hist_len``^2 x
        heads x 4 bytes: a kernel that never materialises them takes less), and a
        step's vocabulary-wide logits and float64 probabilities."""
        return row_bytes(model_shape(self.target.model), hist_len, steps)

    def mining_memory(self) -> int:
        """The memory bound mining takes by default: half the free memory of the
        target's device (``free_memory``)."""
        return free_memory(self.target.device) // 2

    def step_cost(self, reps: int = 20) -> dict:
        """The draft's cost per token relative to a target call, timed now on this
        machine (``evolve.data.sources.hf.clock.draft_cost``): one decoding step of each
        model after a cache of 64 tokens (fewer where the context is shorter), batch 1."""
        from evolve.data.sources.hf import clock   # lazy: on use
        return clock.draft_cost(self.target.model, self.draft.model, self.vocab,
                                 context=max(1, min(64, self.context_len - 1)), reps=reps)

    def task_meta(self) -> dict:
        cfg = self.config
        return {"name": cfg.task_file, "source": "hf", "checker": cfg.checker_text(),
                "end": self.end, "max_new_tokens": cfg.max_new_tokens,
                "task_sha256": cfg.task_sha256,
                **({"stop": list(cfg.stop)} if cfg.stop else {})}

    def describe(self) -> dict:
        return {"task": self.config.task_file, **self.info,
                "problems": {s: len(self.problems[s]) for s in SPLITS}}


def model_shape(model) -> dict:
    """What a model's memory in mining depends on, from its configuration: layers,
    attention and key/value heads, head size, hidden and MLP sizes, vocabulary and
    the bytes of its parameters' dtype."""
    import torch  # lazy: the core install has no torch
    cfg = model.config
    cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    heads = int(cfg.num_attention_heads)
    hidden = int(cfg.hidden_size)
    head_dim = getattr(cfg, "head_dim", None) or hidden // heads
    inner = (getattr(cfg, "intermediate_size", None) or getattr(cfg, "n_inner", None)
             or 4 * hidden)
    dtype = next(model.parameters()).dtype
    return {"layers": int(cfg.num_hidden_layers), "heads": heads,
            "kv_heads": int(getattr(cfg, "num_key_value_heads", None) or heads),
            "head_dim": int(head_dim), "hidden": hidden, "inner": int(inner),
            "vocab": int(cfg.vocab_size),
            "bytes": torch.empty((), dtype=dtype).element_size()}


def row_bytes(shape: dict, hist_len: int, steps: int) -> int:
    """``HFTaskPair.mining_row_bytes`` of a model of this ``model_shape``."""
    kv = 2 * shape["layers"] * shape["kv_heads"] * shape["head_dim"] * shape["bytes"]
    act = hist_len * (shape["hidden"] + shape["inner"]) * shape["bytes"]
    scores = hist_len * hist_len * shape["heads"] * 4
    step = shape["vocab"] * (shape["bytes"] + 4 + 3 * 8)
    return int(kv * (hist_len + steps) + act + scores + step + 3 * 8 * (hist_len + steps))


def free_memory(device) -> int:
    """Free bytes of a torch device: the GPU's (``torch.cuda.mem_get_info``), or the
    machine's available memory for the CPU."""
    import torch  # lazy: the core install has no torch
    dev = torch.device(device)
    if dev.type == "cuda":
        return int(torch.cuda.mem_get_info(dev)[0])
    return LB.available_memory()


def split_problems(problems, seed: int) -> dict:
    """split -> problems: those with a split keep it; the others are dealt out train,
    valid, train, test after a shuffle seeded by ``seed``."""
    out = by_split(problems)
    free = [p for p in problems if p.split is None]
    perm = np.random.default_rng(np.random.SeedSequence([seed, 3])).permutation(len(free))
    for j, i in enumerate(perm):
        out[("train", "valid", "train", "test")[j % 4]].append(free[i])
    return out


def build_pair(config: HFTaskConfig) -> HFTaskPair:
    """Read and check the task file, load the pair, and size the context; every
    failure is one line (DataError naming the file and line, HFTraceError naming
    the model, TraceConfigError naming the setting)."""
    config.validate()
    if not config.task_sha256:          # recording: paths as the traces will name them
        config = replace(config, task_file=HM.absolute(config.task_file),
                         target=HM.absolute(config.target, local_only=True),
                         draft=HM.absolute(config.draft, local_only=True))
    problems = read_tasks(config.task_file, config.delimiter)
    checker = config.checker(problems)
    sha = sha256_file(config.task_file)
    if config.task_sha256 and config.task_sha256 != sha:
        raise DataError(f"{config.task_file}: the task file changed since these traces were "
                        "recorded (its checksum differs); record them again")
    problems = split_problems(problems, config.seed)
    for s in SPLITS:
        if not problems[s]:
            raise DataError(f"{config.task_file}: the {s} split has no problem (give more "
                            f"problems, or label some with \"split\": \"{s}\")")
        cap = getattr(config, f"{s}_prompts")
        problems[s] = problems[s][:cap]
    # what the context needs, from the tokenizer and the models' configurations: a
    # context the models cannot hold is refused before they load
    limit = min(v for v in (HM.max_positions(HM.load_config("--target", config.target)),
                            HM.max_positions(HM.load_config("--draft", config.draft)),
                            1 << 20) if v is not None)
    tok = HM.load_tokenizer("--target", config.target)
    longest, where = 0, None
    for s in SPLITS:
        for i, p in enumerate(problems[s]):
            n = len(tok(p.prompt)["input_ids"])
            if n > longest:
                longest, where = n, (s, i)
    C = longest + config.max_new_tokens + config.block_size + 1
    if C > limit:
        raise ngram.TraceConfigError(
            "max_new_tokens", f"{config.max_new_tokens} is too large; the longest prompt "
            f"({where[0]} problem {where[1]}, {longest} tokens), {config.max_new_tokens} new "
            f"tokens and a block of {config.block_size} need {C} positions, and the models "
            f"hold {limit}")
    if config.context_len and config.context_len != C:
        raise DataError(f"{config.task_file}: the prompts need a context of {C} tokens, the "
                        f"traces were recorded with {config.context_len}; record them again")
    loaded = HM.load_pair(config.trace_config())
    torch, _ = HM.require_libs()
    tok = loaded.tokenizer
    if config.top_k > loaded.vocab:
        raise ngram.TraceConfigError("top_k", f"{config.top_k} is invalid; expected 1.."
                                     f"{loaded.vocab} (the vocabulary)")
    config = replace(config, context_len=C, task_sha256=sha)
    info = {"target": loaded.info["target"], "draft": loaded.info["draft"],
            "device": loaded.info["device"], "dtype": loaded.info["dtype"],
            "torch": torch.__version__, "transformers": loaded.info["transformers"]}
    views = [ModelView(m, loaded.vocab, config.temperature, loaded.device, name,
                       loaded.info[role])
             for m, name, role in ((loaded.target, config.target, "target"),
                                   (loaded.draft, config.draft, "draft"))]
    eos = getattr(tok, "eos_token_id", None)
    end = int(eos) if isinstance(eos, int) and 0 <= eos < loaded.vocab else None
    return HFTaskPair(views[0], views[1], tok, problems, config, loaded.vocab, info, end,
                      checker)
