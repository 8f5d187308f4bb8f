"""The hall of fame: the best distinct trees seen, by tree text, best first."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from evolve.lang import treeio


@dataclass
class HofEntry:
    tree: str
    fitness: float
    size: int
    born: int


class HallOfFame:
    """The best distinct trees seen on train (by tree text), best first."""

    def __init__(self, size: int):
        self.size = size
        self.entries: list[HofEntry] = []

    @staticmethod
    def _key(e: HofEntry):
        return (-e.fitness, e.size, e.born, e.tree)

    def update(self, texts: list[str], fits, sizes, borns) -> None:
        """Add the best of a population given as parallel sequences (tree text,
        fitness, size, generation born), in population order: an individual
        whose tree is already in enters no more; the first of equal trees wins."""
        candidates = range(len(texts))
        if len(self.entries) >= self.size:
            # the bar only rises while the hall is full: whoever is below it now
            # cannot enter, so only the others are looked at one by one
            candidates = np.flatnonzero(np.asarray(fits) >= self.entries[-1].fitness).tolist()
        have = {e.tree: e for e in self.entries}
        for i in candidates:
            s = texts[i]
            if s in have:
                continue
            e = HofEntry(s, float(fits[i]), int(sizes[i]), int(borns[i]))
            if len(self.entries) >= self.size and self._key(e) >= self._key(self.entries[-1]):
                continue
            have[s] = e
            self.entries.append(e)
            self.entries.sort(key=self._key)
            if len(self.entries) > self.size:
                dropped = self.entries.pop()
                have.pop(dropped.tree, None)

    def add(self, entries) -> None:
        """Merge entries (e.g. scored on valid), keeping the best ``size`` distinct trees."""
        have = {e.tree for e in self.entries}
        self.entries.extend(e for e in entries if e.tree not in have)
        self.entries.sort(key=self._key)
        del self.entries[self.size:]

    def to_json(self) -> list[dict]:
        return [asdict(e) for e in self.entries]

    @classmethod
    def from_json(cls, size: int, data: list[dict]) -> "HallOfFame":
        hof = cls(size)
        for d in data:
            treeio.parse(d["tree"])
            hof.entries.append(HofEntry(str(d["tree"]), float(d["fitness"]), int(d["size"]),
                                        int(d["born"])))
        hof.entries.sort(key=cls._key)
        return hof
