"""Short instructions for a chat model, written here: the prompts of its traces.

Every instruction is one of ``TEMPLATES`` about one of ``TOPICS`` (everyday things,
nature, science, places, activities), rendered with the model's chat template
(``chat_tasks.render``) and written as a prompts file of the Hugging Face trace source
(``evolve data trace --backend hf --prompts FILE``: JSON lines with ``text`` and
``split``). The split is the topic's: topics are dealt train, train, valid, test in
list order, so an instruction of the test split is about a topic no train instruction
names (the draft built from a pair's train answers never saw it).

    python -m evolve.data.sources.pairs.instructions --tokenizer DIR --out FILE
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from evolve.data.sources.pairs.chat_tasks import render
from evolve.io.atomic import atomic_write_text

TEMPLATES = (
    "Explain what {0} is in two sentences.",
    "Write a short poem about {0}.",
    "Give three facts about {0}.",
    "Describe {0} to a child.",
    "Why is {0} important?",
    "Write one sentence about {0}.",
)

TOPICS = (
    "water", "the sun", "a bicycle", "the moon", "bread", "a volcano", "rain", "music",
    "a library", "the ocean", "trees", "electricity", "a computer", "friendship", "winter",
    "coffee", "the internet", "a honeybee", "mountains", "a rainbow", "sleep", "chess",
    "a train", "gravity", "the heart", "a river", "snow", "a city park", "photosynthesis",
    "a telescope", "soccer", "a desert", "the brain", "recycling", "a museum", "clouds",
    "a guitar", "vaccines", "the alphabet", "a lighthouse", "penguins", "wind", "the weekend",
    "a farm", "exercise", "money", "a dictionary", "earthquakes", "a garden", "the stars",
    "a hospital", "an airplane", "dolphins", "a calendar", "fire", "the seasons", "a school",
    "bees and flowers", "a map", "the rain forest", "a bridge", "tea", "elephants",
    "a birthday", "a clock", "the Earth", "cooking", "a smartphone", "the wind in autumn",
    "salt", "a camera", "thunderstorms", "a kitchen", "the human skeleton", "reading",
    "a post office", "glaciers", "a piano", "teamwork", "a butterfly",
)

SPLIT_CYCLE = ("train", "train", "valid", "test")       # 2 : 1 : 1, by topic


def instructions() -> list[tuple[str, str]]:
    """(instruction, split) of every topic and template, topic by topic."""
    return [(t.format(topic), SPLIT_CYCLE[i % len(SPLIT_CYCLE)])
            for i, topic in enumerate(TOPICS) for t in TEMPLATES]


def write(path: str | Path, tokenizer) -> Path:
    """The prompts file: one line per instruction, ``text`` rendered for the chat model."""
    lines = [json.dumps({"text": render(tokenizer, text), "split": split}, ensure_ascii=False)
             for text, split in instructions()]
    atomic_write_text(path, "\n".join(lines) + "\n")
    return Path(path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--tokenizer", required=True, help="a model folder with a chat template")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    from transformers import AutoTokenizer    # lazy: an optional extra
    path = write(args.out, AutoTokenizer.from_pretrained(args.tokenizer))
    print(f"{path}: {len(instructions())} instructions")
    return 0


if __name__ == "__main__":
    sys.exit(main())
