"""The task pair: the grammar-exact target and an n-gram draft, for the decoder.

``build_pair(TaskPairConfig(...))`` draws the arithmetic task's splits
(``arithmetic.generate``), makes the target (``target.GrammarTarget``) and trains
the draft: a byte-level Kneser-Ney n-gram (``ngram_lm.NGramLM``, order
``draft_order``) on ``draft_samples`` solutions per train problem drawn from the
grammar (``grammar.sample_solution``: the target's own samples at temperature 1
without the floor), each after the prompt's end and followed by ``PAD`` bytes
(``draft_text``). The draft learns the wording and the shape of the steps; with
five bytes of history (order 6) it sees neither the story nor a step's operands,
so it misses the arithmetic.

Both expose ``probs(H)`` on (B, C) uint8 histories, C = ``context_len``, and the
pair's ``config`` (``TaskPairConfig``) holds ``block_size``, ``top_k``,
``context_len``, ``temperature`` and ``seed``, so ``evolve.data.decode.decode``
decodes with the pair as it is.

The pair is also what the recorder (``record``) and the arbiter
(``evolve.freerun.task_compare``) ask of a task, the interface the Hugging Face task pair
(``hf_pair``) has too: ``prompts(split, n)`` (padded prompts and their generators),
``decode(prompts, rngs, blocks, advance=..., ...)`` (``evolve.data.decode.decode``'s
decoding, with progress counted in problems),
``max_new(split)`` (blocks to decode at most), ``end`` and ``max_tokens`` (what ends
a text), ``pad``, ``body(tokens)`` (a generated text before its end, as text),
``answer_of`` and ``done_of`` (of a history's tokens), ``checker`` and
``task_meta()``.
Prompts are left-padded with ``PAD`` ("no text" to both models) to ``context_len``
bytes (``pad_prompts``); ``context_len`` must hold every prompt and the longest
solution the grammar allows for it, which ``build_pair`` checks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from evolve.data.decode import BATCH, batch_ticks, decode
from evolve.data.labels import available_memory
from evolve.data.sources import ngram_lm as LM
from evolve.data.sources.ngram import ConfigFields, TraceConfigError
from evolve.data.sources.task import arithmetic, grammar
from evolve.data.sources.task.checker import DelimiterChecker, cut_at_stop, stop_problem
from evolve.data.sources.task.files import Problem
from evolve.data.sources.task.story import PROMPT_END, parse_prompt
from evolve.data.sources.task.target import GrammarTarget
from evolve.data.tokens import SPLITS

MAX_PROMPTS = 100_000
MAX_CONTEXT = 4096
MAX_DRAFT_SAMPLES = 16


@dataclass(frozen=True)
class TaskPairConfig(ConfigFields):
    """Everything the task pair depends on."""
    seed: int = 0                    # the problems (arithmetic.generate), samples, decoding
    draft_order: int = 6             # the draft n-gram's order (history: order - 1 bytes)
    draft_samples: int = 2           # solutions per train problem the draft trains on
    temperature: float = 1.0         # applied to both models
    floor: float = 1e-6              # the target's least probability of any byte
    block_size: int = 4              # g, drafts per block
    top_k: int = 16                  # draft candidates a trace stores per drafted position
    context_len: int = 384           # C: the history both models read, prompt and solution
    train_prompts: int = 2000        # problems per split (the draft trains on train's)
    valid_prompts: int = 300
    test_prompts: int = 300
    stop: tuple = ()                 # stop strings: a text ends where one starts

    def __post_init__(self):
        if isinstance(self.stop, list):          # read back from meta.json
            object.__setattr__(self, "stop", tuple(self.stop))

    def validate(self) -> None:
        need = self.need
        self.check_types(floats=("temperature", "floor"), others=("stop",))
        why = stop_problem(self.stop)
        need(not why, "stop", why)
        need(0 <= self.seed < 2 ** 63, "seed", "expected an integer >= 0")
        need(1 <= self.draft_order <= LM.MAX_ORDER, "draft_order", f"expected 1..{LM.MAX_ORDER}")
        need(1 <= self.draft_samples <= MAX_DRAFT_SAMPLES, "draft_samples",
             f"expected 1..{MAX_DRAFT_SAMPLES}")
        need(self.temperature > 0, "temperature", "expected > 0")
        need(0 < self.floor <= 1 / (2 * LM.VOCAB), "floor", f"expected in (0, {1 / 512}]")
        need(1 <= self.block_size <= 64, "block_size", "expected 1..64")
        need(1 <= self.top_k <= LM.VOCAB, "top_k", f"expected 1..{LM.VOCAB}")
        need(self.draft_order - 1 <= self.context_len <= MAX_CONTEXT, "context_len",
             f"expected draft_order - 1..{MAX_CONTEXT}")
        for s in SPLITS:
            need(1 <= self.prompts(s) <= MAX_PROMPTS, f"{s}_prompts",
                 f"expected 1..{MAX_PROMPTS:,}")


@dataclass
class TaskPair:
    target: GrammarTarget
    draft: LM.NGramLM
    problems: dict                   # split -> list of Problem
    config: TaskPairConfig

    end = grammar.PAD                # a solution ends with PAD after its text
    pad = grammar.PAD                # prompts are left-padded with it ("no text")
    max_tokens = None                # no budget of generated tokens: the grammar ends
    checker = DelimiterChecker()     # "#### answer"

    @property
    def context_len(self) -> int:
        return self.config.context_len

    def prompts(self, split: str, n: int | None = None):
        return prompts_of(self, split, n)

    def decode(self, prompts, rngs, blocks: int, advance=None, **kw):
        """``evolve.data.decode.decode`` of the problems ``prompts`` (the pairs'
        interface: ``advance(n)``, when given, after each batch of n problems)."""
        if self.config.stop:                 # a stop string ends a text too
            kw.setdefault("done_of", self.done_of)
        return decode(self, prompts, rngs, blocks, BATCH,
                      tick=batch_ticks(len(prompts), BATCH, advance), **kw)

    def max_new(self, split: str) -> int:
        """Blocks to decode at most: the most bytes a solution of the split can take
        (the grammar's longest), and as many again for a text that leaves the grammar."""
        return 2 * max(grammar.longest_solution(parse_prompt(p.prompt))
                       for p in self.problems[split])

    def body(self, tokens) -> str:
        """A generated text (its bytes) before its end, as text (one byte a character),
        cut at the first stop string."""
        b = bytes(bytearray(tokens))
        return cut_at_stop(b.split(bytes([self.end]), 1)[0].decode("latin-1"),
                           self.config.stop)

    def answer_of(self, tokens):
        """The final answer in a history (leading PAD dropped), None when it has none."""
        b = bytes(bytearray(tokens)).lstrip(bytes([self.pad]))
        return self.checker.extract(self.body(b))

    def done_of(self, tokens) -> bool:
        """Whether a history has ended: the solution's end (PAD after text), or a stop
        string in its text."""
        b = bytes(bytearray(tokens)).lstrip(bytes([self.pad]))
        if self.end in b:
            return True
        return bool(self.config.stop) and len(self.body(b)) < len(b.decode("latin-1"))

    def mining_row_bytes(self, hist_len: int, steps: int) -> int:
        """An estimate of the host memory one continuation takes in mining: its history
        and text (a byte and a list entry a token), a step's float64 probabilities, and
        its uniforms."""
        return 9 * (hist_len + steps) + 2 * 8 * 256 + 8 * steps

    def mining_memory(self) -> int:
        """The memory bound mining takes by default: half the machine's available
        memory."""
        return available_memory() // 2

    def task_meta(self) -> dict:
        return {"name": "arithmetic", "source": "arithmetic",
                "checker": "#### (the last delimiter's line)", "end": self.end,
                **({"stop": list(self.config.stop)} if self.config.stop else {})}

    def describe(self) -> dict:
        return {"task": "arithmetic", "target": self.target.describe(),
                "draft": self.draft.describe(),
                "problems": {s: len(self.problems[s]) for s in SPLITS}}


def _seeds(seed: int):
    """The streams beside the problems' (``arithmetic.generate(seed)``, so a seed's
    problems are the task's own): the draft's training samples, and decoding."""
    return np.random.SeedSequence([seed, 1]), np.random.SeedSequence([seed, 2])


def needed_context(problem: Problem) -> int:
    """Bytes a model's context must hold for a problem of the arithmetic task: its
    prompt and the longest solution the grammar allows for it."""
    story = parse_prompt(problem.prompt)
    if story is None:
        raise ValueError(f"not a prompt of the arithmetic task: {problem.prompt[:60]!r}")
    return len(problem.prompt.encode("utf-8")) + grammar.longest_solution(story)


def draft_text(problems, samples: int, rng, order: int) -> list[bytes]:
    """The draft's training documents: ``samples`` solutions of each problem drawn
    from the grammar, each after the prompt's end (``story.PROMPT_END``, the history
    the draft sees at a solution's start) and followed by ``order - 1`` PAD bytes
    (the end, and what follows it). The prompts themselves are left out: the
    decoder never asks the draft about them, and their sentences would blend into
    the steps' wording."""
    pad = bytes([grammar.PAD]) * max(order - 1, 1)
    docs = []
    for p in problems:
        story = parse_prompt(p.prompt)
        for _ in range(samples):
            docs.append((PROMPT_END + grammar.sample_solution(story, rng)).encode("ascii")
                        + pad)
    return docs


def build_pair(config: TaskPairConfig | None = None) -> TaskPair:
    """The problems, the target and the trained draft (deterministic for the config)."""
    config = config or TaskPairConfig()
    config.validate()
    s_samples, _ = _seeds(config.seed)
    problems = arithmetic.generate(config.seed, {s: config.prompts(s) for s in SPLITS})
    for s in SPLITS:
        for i, p in enumerate(problems[s]):
            need = needed_context(p)
            if need > config.context_len:
                raise TraceConfigError("context_len", f"{config.context_len} is too small; "
                                       f"{s} problem {i} needs {need} bytes")
    docs = draft_text(problems["train"], config.draft_samples,
                      np.random.default_rng(s_samples), config.draft_order)
    draft = LM.NGramLM.train(docs, config.draft_order, config.temperature)
    target = GrammarTarget(config.temperature, config.floor)
    return TaskPair(target, draft, problems, config)


def pad_prompts(prompts, context_len: int) -> np.ndarray:
    """Prompts (str or bytes) left-padded with PAD to (n, context_len) uint8."""
    out = np.full((len(prompts), context_len), grammar.PAD, dtype=np.uint8)
    for i, p in enumerate(prompts):
        b = p.encode("utf-8") if isinstance(p, str) else bytes(p)
        if len(b) > context_len:
            raise ValueError(f"prompt {i} has {len(b)} bytes, more than context_len="
                             f"{context_len}")
        out[i, context_len - len(b):] = np.frombuffer(b, dtype=np.uint8)
    return out


def prompts_of(pair: TaskPair, split: str, n: int | None = None):
    """(the first n prompts of a split, padded, (n, context_len) uint8; one numpy
    Generator per prompt for the decoder's uniforms)."""
    problems = pair.problems[split][:n]
    _, decoding = _seeds(pair.config.seed)
    children = decoding.spawn(len(SPLITS))[SPLITS.index(split)].spawn(len(problems))
    return (pad_prompts([p.prompt for p in problems], pair.config.context_len),
            [np.random.default_rng(c) for c in children])


def rebuild(meta: dict):
    """The task pair that recorded traces of this meta.json: the built-in pair from
    its configuration, or a Hugging Face pair and task file (``hf_pair``; the task
    file must be the one recorded, by checksum). KeyError, TypeError or ValueError
    for a configuration that cannot be rebuilt; an EvolveError (one line) for models
    or a task file that cannot be used."""
    if (meta.get("task") or {}).get("source") == "hf":
        from evolve.data.sources.task import hf_pair    # lazy: torch only for hf tasks
        return hf_pair.build_pair(hf_pair.HFTaskConfig.from_dict(meta["config"]))
    return build_pair(TaskPairConfig.from_dict(meta["config"]))
