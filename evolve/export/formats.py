"""The export formats: one record each, the one place a format is declared.

A ``Format`` says what ``evolve export --format NAME`` writes (a module, or a patch
against an engine's source), in which array library the rule is written, what the
written file needs, the phrase of the command's help, which engine it deploys into
(its settings lines, ``evolve.export.engines.settings_lines``), whether a rule scored
in greedy decoding can go there, and what the engine hands over: the glue tensors its
code holds (``holds``; an input is provided where its registry expression,
``evolve.lang.features.Input.engine``, reads only those) or, for a patch, the kernel's
own variables (``kernel``). None of the two: every input is an argument of the module's
functions. The command line, the exporters, ``evolve run --engine`` and ``Rule.source``
all read this table. It imports nothing heavy (``evolve --help`` reads it).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from evolve.lang.features import REGISTRY


@dataclass(frozen=True)
class Format:
    name: str
    kind: str                    # "module" or "patch"
    backend: str                 # the array library the rule is written in
    needs: str                   # what the written file needs
    help: str                    # its phrase in `evolve export --format`'s help
    engine: str | None = None    # the engine it deploys into (settings lines; --engine)
    greedy: bool = False         # a rule scored in greedy decoding exports here
    holds: tuple | None = None   # the glue's tensors (see evolve.export.engines)
    kernel: tuple | None = None  # a patch: the inputs its kernel holds at the accept test


# The glue tensors of the engine formats (evolve.export.engines): p and q the target's and
# the draft's probabilities [n, vocab], x the drafted tokens, rows = arange(n), block the
# block positions, position the sequence positions, slots the slot features and lookahead
# inputs computed from p and q, entropy the entropy function, and torch itself; classes
# the vocabulary's token classes (the transformers drop-in: from the tokenizer install()
# is given, by the same code as the recorders, evolve.data.vocab_class).
_GLUE = ("p", "q", "x", "rows", "block", "slots", "entropy", "torch")

FORMATS: dict[str, Format] = {f.name: f for f in (
    Format("numpy", "module", "numpy", "numpy", "threshold/accept over arrays", greedy=True),
    Format("torch", "module", "torch", "torch", "threshold/accept over tensors", greedy=True),
    Format("hf", "module", "torch", "torch and transformers",
           "a drop-in for transformers' assisted generation", engine="transformers",
           holds=_GLUE + ("position", "classes")),
    Format("vllm", "module", "torch", "torch (inside vLLM)",
           "the rule over the tensors of vLLM's rejection sampler (a module)", engine="vllm",
           holds=_GLUE),
    Format("vllm-patch", "patch", "triton", "vLLM 0.33.0",
           "a unified diff against vLLM 0.33.0's vllm/v1/sample/rejection_sampler.py that "
           "puts the rule in its Triton kernel (patch -p1)", engine="vllm",
           kernel=("draft_prob", "target_prob", "block_position")),
)}
NAMES = tuple(FORMATS)
MODULES = tuple(n for n, f in FORMATS.items() if f.kind == "module")
PATCHES = tuple(n for n, f in FORMATS.items() if f.kind == "patch")
GREEDY = tuple(n for n, f in FORMATS.items() if f.greedy)


def reads(expression: str) -> set:
    """The names an engine expression reads."""
    return {n.id for n in ast.walk(ast.parse(expression, mode="eval"))
            if isinstance(n, ast.Name)}


def provides(name: str) -> tuple | None:
    """The inputs a format can compute, in table order (None: every input is an
    argument)."""
    f = FORMATS[name]
    if f.kernel is not None:
        return f.kernel
    if f.holds is None:
        return None
    return tuple(i.name for i in REGISTRY
                 if i.engine is not None and reads(i.engine) <= set(f.holds))


def help_text() -> str:
    """The ``--format`` help: each format and what it writes."""
    return "; ".join(f"{n}: {f.help}" for n, f in FORMATS.items()) + "."


# The engines a run can be limited to (``evolve run --engine``): the format that deploys a
# rule there with the fewest inputs, so that the champion exports by construction
ENGINE_FORMATS = {"vllm": "vllm-patch", "transformers": "hf"}
