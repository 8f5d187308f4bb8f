"""The grammar-exact target: next-byte distributions computed from the task's grammar.

As the n-gram pair's target is computed exactly from counts, this one is computed
exactly from the task's own grammar (``story``, ``grammar``). For a history (the
last ``context_len`` bytes: ``PAD`` bytes, the prompt, the text generated so far):

1. leading ``PAD`` bytes are "no text" and dropped; a ``PAD`` after text means the
   solution has ended: the next byte is ``PAD``;
2. the prompt is the text up to the first ``story.PROMPT_END``, read back into its
   story by ``story.parse_prompt``; a history with no such prompt (one this task
   did not write) gets the uniform distribution;
3. the generated text's complete lines give the grammar's state, hence the lines
   that may come next with their weights (``grammar.lines_of``; after the answer
   line only ``PAD``); the partial line after the last ``\\n`` is aligned with each
   of them, and each line's weight goes to the byte that follows its best
   alignments (``alignment_mass``): on the grammar's path, the lines that start
   with the partial line, so the mass is spread over the allowed wordings and sits
   on the right digits; off it (a byte the grammar did not allow), the prefixes of
   lines at the least edit distance from the partial line, so the target carries
   on as close to its grammar as it can (a wrong digit becomes a wrong number of
   the right length, a mixed wording rejoins a line); a line of ``MAX_LINE`` bytes
   ends;
4. the mass is tempered (``m ** (1 / temperature)``, renormalised) and mixed with a
   floor: ``p = (1 - 256 floor) m + floor``, so every byte has ``p >= floor`` and
   the draft/target ratios stay finite.
"""

from __future__ import annotations

import math

import numpy as np

from evolve.data.sources.task import grammar as G
from evolve.data.sources.task.story import PROMPT_END, parse_prompt

VOCAB = 256
NEWLINE = ord("\n")
MAX_LINE = 200
CACHE_ENTRIES = 100_000     # prompts and states kept; the caches are cleared beyond
MASS_ENTRIES = 20_000       # next-byte masses kept (2 KB each)
_PROMPT_END = PROMPT_END.encode("ascii")


def _text(b: bytes) -> str:
    return b.decode("latin-1")        # one character a byte, whatever the bytes


def _one_hot(byte: int) -> np.ndarray:
    m = np.zeros(VOCAB)
    m[byte] = 1.0
    return m


def alignment_mass(lines, partial: bytes) -> np.ndarray:
    """Unnormalised next-byte mass of candidate ``lines`` ((bytes, weight) pairs)
    after a ``partial`` line: each line aligned with ``partial`` at every end j
    (``partial`` against the line's first j bytes, by edit distance: substitutions,
    insertions and deletions cost 1); the lines whose best alignments reach the
    least distance share their weight equally over those ends, each end giving the
    line's byte j, or ``\\n`` at its end. At distance 0 these are the lines that
    start with ``partial`` (computed directly)."""
    m = len(partial)
    exact = [(c, w) for c, w in lines if c.startswith(partial)]
    if not exact:
        return edit_mass(lines, partial)
    mass = np.zeros(VOCAB)
    for c, w in exact:
        mass[c[m] if m < len(c) else NEWLINE] += w
    return mass


def edit_mass(lines, partial: bytes) -> np.ndarray:
    """``alignment_mass`` by the edit distances alone (any distance): one row of the
    distance table per byte of ``partial``, all lines and ends at once."""
    mass = np.zeros(VOCAB)
    lens = np.array([len(c) for c, _ in lines])
    width = int(lens.max())
    codes = np.full((len(lines), width), -1, dtype=np.int16)
    for i, (c, _) in enumerate(lines):
        codes[i, :len(c)] = np.frombuffer(c, dtype=np.uint8)
    j = np.arange(width + 1, dtype=np.float64)
    D = np.tile(j, (len(lines), 1))                     # partial's first 0 bytes vs c[:j]
    for x in partial:
        T = D + 1.0                                     # x left unmatched
        T[:, 1:] = np.minimum(T[:, 1:], D[:, :-1] + (codes != x))    # x against c[j-1]
        D = np.minimum.accumulate(T - j, axis=1) + j    # bytes of c skipped
    D[j[None, :] > lens[:, None]] = np.inf
    hit = D == D.min()
    for i in np.flatnonzero(hit.any(axis=1)):
        c, w = lines[i]
        ends = np.flatnonzero(hit[i])
        for e in ends:
            mass[c[e] if e < len(c) else NEWLINE] += w / ends.size
    return mass


class GrammarTarget:
    """The target model of the task pair: ``probs(H)`` as the decoder asks."""

    def __init__(self, temperature: float = 1.0, floor: float = 1e-6):
        if not (math.isfinite(temperature) and temperature > 0):
            raise ValueError(f"temperature must be > 0 and finite, got {temperature!r}")
        if not 0 < floor <= 1 / (2 * VOCAB):
            raise ValueError(f"floor must be in (0, {1 / (2 * VOCAB)}], got {floor!r}")
        self.temperature = float(temperature)
        self.floor = float(floor)
        self._stories: dict = {}
        self._lines: dict = {}
        self._masses: dict = {}

    def probs(self, history) -> np.ndarray:
        """Next-byte distributions, float64 (B, 256), of a (B, L) uint8 history."""
        H = np.asarray(history, dtype=np.uint8)
        if H.ndim == 1:
            return self.probs(H[None, :])[0]
        if H.ndim != 2:
            raise ValueError(f"history must be (B, L), got shape {H.shape}")
        M = np.empty((H.shape[0], VOCAB))
        for i, row in enumerate(H):
            M[i] = self.mass(row.tobytes())
        return self._smooth(M)

    def mass(self, row: bytes) -> np.ndarray:
        """The grammar's unnormalised next-byte mass after one history (steps 1-3);
        kept per text (rules decoding the same problems share most of their histories,
        and the alignment off the grammar's path is the costly step)."""
        text = row.lstrip(bytes([G.PAD]))
        kept = self._masses.get(text)
        if kept is None:
            if len(self._masses) >= MASS_ENTRIES:
                self._masses.clear()
            kept = self._masses[text] = self._mass(text)
            kept.flags.writeable = False
        return kept

    def _mass(self, text: bytes) -> np.ndarray:
        if bytes([G.PAD]) in text:
            return _one_hot(G.PAD)
        cut = text.find(_PROMPT_END)
        if cut < 0:
            return np.ones(VOCAB)
        prompt, generated = text[:cut + len(_PROMPT_END)], text[cut + len(_PROMPT_END):]
        nl = generated.rfind(b"\n") + 1
        lines = self._next_lines(prompt, generated[:nl])
        if lines is None:
            return np.ones(VOCAB)
        if not lines:
            return _one_hot(G.PAD)
        partial = generated[nl:]
        if len(partial) >= MAX_LINE:
            return _one_hot(NEWLINE)
        return alignment_mass(lines, partial)

    def _next_lines(self, prompt: bytes, done: bytes):
        """(line bytes, weight) of what may come next; [] after the answer; None when
        the prompt is not one of the task's."""
        key = (prompt, done)
        if key not in self._lines:
            if len(self._lines) >= CACHE_ENTRIES:
                self._lines.clear()
                self._stories.clear()
            if prompt not in self._stories:
                self._stories[prompt] = parse_prompt(_text(prompt))
            story = self._stories[prompt]
            if story is None:
                self._lines[key] = None
            else:
                state = G.state_of(story, _text(done).split("\n")[:-1])
                lines = G.lines_of(story, state)
                self._lines[key] = [] if lines is None else [
                    (line.encode("latin-1"), w) for line, w in lines]
        return self._lines[key]

    def _smooth(self, M: np.ndarray) -> np.ndarray:
        """Step 4: temper and floor each row of masses."""
        P = M / M.sum(axis=1, keepdims=True)
        if self.temperature != 1.0:
            with np.errstate(divide="ignore"):
                P = np.where(P > 0, np.exp(np.log(P) / self.temperature), 0.0)
            P /= P.sum(axis=1, keepdims=True)
        return (1.0 - VOCAB * self.floor) * P + self.floor

    def describe(self) -> dict:
        return {"kind": "grammar", "temperature": self.temperature, "floor": self.floor}
