"""The task pair (evolve/data/sources/task/target.py, pair.py, greedy.py): the
target's distribution is the grammar's, exactly (against a brute-force enumeration
of whole solutions), sums to 1, is positive everywhere and puts the right digit
first; its edit-distance alignment against a slow reference; greedy accuracy of
the target and the draft; the decoder decodes with the pair and records valid
traces; builds are deterministic and configurations checked."""

import operator
import re

import numpy as np
import pytest

from evolve.data import traces as T
from evolve.data.decode import decode
from evolve.data.sources.ngram import TraceConfigError
from evolve.data.sources.task import grammar as G
from evolve.data.sources.task import greedy
from evolve.data.sources.task import pair as TP
from evolve.data.sources.task import target as TG
from evolve.data.sources.task.checker import DelimiterChecker
from evolve.data.sources.task.story import Story, parse_prompt

SMALL = TP.TaskPairConfig(train_prompts=200, valid_prompts=20, test_prompts=60)
OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul}
EQUATION = re.compile(r"(-?\d+) ([-+*]) (\d+) = (-?\d+)")
STORY = Story("Tom", "he", "apples", 23, ("+", "-"), (19, 7))
PROMPT = ("Question: Tom has 23 apples. Then he buys 19 more. Later, he sells 7 apples. "
          "How many apples does Tom have now?\nAnswer:\n")


@pytest.fixture(scope="module")
def pair():
    return TP.build_pair(SMALL)


def _histories(prompt: str, text: str, C: int) -> np.ndarray:
    """The histories before each byte of ``text`` and before the byte after it."""
    return TP.pad_prompts([prompt + text[:t] for t in range(len(text) + 1)], C)


def _grammar_part(target, P):
    return (P - target.floor) / (1 - TG.VOCAB * target.floor)


def _solutions(story):
    """Every whole solution of a story with its probability, by brute force."""
    out = {}

    def walk(state, text, prob):
        lines = G.lines_of(story, state)
        if lines is None:
            out[text + "\0"] = out.get(text + "\0", 0.0) + prob
            return
        for line, w in lines:
            walk(G.advance(story, state, line), text + line + "\n", prob * w)

    walk(G.start(story), "", 1.0)
    return out


def test_the_target_is_the_grammar_exactly(pair):
    """At every prefix of sampled solutions, the target's next-byte mass is the
    conditional distribution of the next byte over all whole solutions."""
    assert parse_prompt(PROMPT) == STORY
    solutions = _solutions(STORY)
    assert abs(sum(solutions.values()) - 1) < 1e-12 and len(solutions) > 500
    rng = np.random.default_rng(3)
    C = pair.config.context_len
    for _ in range(4):
        text = G.sample_solution(STORY, rng)
        P = _grammar_part(pair.target, pair.target.probs(_histories(PROMPT, text, C)))
        for t in range(len(text) + 1):
            want = np.zeros(TG.VOCAB)
            for s, prob in solutions.items():
                if s.startswith(text[:t]):
                    want[ord(s[t])] += prob
            np.testing.assert_allclose(P[t], want / want.sum(), atol=1e-9)


def test_target_rows_sum_to_one_are_positive_and_put_the_right_digit_first(pair):
    rng = np.random.default_rng(1)
    C, floor = pair.config.context_len, pair.target.floor
    checked = 0
    for p in pair.problems["test"][:20]:
        text = G.sample_solution(parse_prompt(p.prompt), rng) + "\0"
        P = pair.target.probs(_histories(p.prompt, text, C)[:-1])
        np.testing.assert_allclose(P.sum(axis=1), 1.0, rtol=0, atol=1e-12)
        assert P.min() >= floor * (1 - 1e-12)
        digits = []                        # positions of results, computed independently
        offset = 0
        for line in text.split("\n"):
            m = EQUATION.search(line)
            if m:
                a, op, b, r = m.groups()
                assert int(r) == OPS[op](int(a), int(b))
                digits += range(offset + m.start(4), offset + m.end(4))
            if line.startswith("#### "):
                assert line[5:] == p.answer
                digits += range(offset + 5, offset + len(line))
            offset += len(line) + 1
        for t in digits:
            assert np.argmax(P[t]) == ord(text[t])
            assert P[t, ord(text[t])] >= 1 - TG.VOCAB * floor - 1e-12
        checked += len(digits)
        spread = (P > 0.01).sum(axis=1)
        assert spread[0] >= 3                 # the first line: several wordings
    assert checked > 60


def test_temperature_flattens_the_wording_and_keeps_the_argmax(pair):
    hot = TG.GrammarTarget(temperature=2.0, floor=pair.target.floor)
    H = _histories(PROMPT, "First, 23 + 19 = 4", pair.config.context_len)
    P, Q = pair.target.probs(H), hot.probs(H)
    np.testing.assert_allclose(Q.sum(axis=1), 1.0, atol=1e-12)
    assert (np.argmax(P, axis=1) == np.argmax(Q, axis=1)).all()
    assert Q[0].max() < P[0].max()


def test_the_end_the_pad_and_a_history_without_a_prompt(pair):
    C = pair.config.context_len
    done = "23 + 19 = 42.\n42 - 7 = 35.\n#### 35\n"
    P = pair.target.probs(TP.pad_prompts([PROMPT + done, PROMPT + done + "\0\0",
                                          "no question here", ""], C))
    assert (np.argmax(P[:2], axis=1) == G.PAD).all()
    P = pair.target.probs(TP.pad_prompts([PROMPT + "23 + 19\0", PROMPT + "\0"], C))
    assert (np.argmax(P, axis=1) == G.PAD).all()            # a PAD after text ends it
    np.testing.assert_allclose(P[2:], 1 / TG.VOCAB)


def test_off_the_grammar_the_target_carries_on_as_close_as_it_can(pair):
    """A wrong digit becomes a wrong number of the right length that carries into
    the answer; a wrong operand or wording is left behind."""
    C, end = pair.config.context_len, 200

    def after(text):
        out, _ = greedy.generate(pair.target, TP.pad_prompts([PROMPT + text], C), end)
        return out[0].decode()

    assert after("23 + 19 = 5").startswith("2.\n")
    assert after("23 + 19 = 52.\n").endswith("52 - 7 = 45.\n#### 45\n")
    assert after("23 + 18 = ").startswith("42.\n")
    assert after("First, adding 19 to 23 gives").endswith("#### 35\n")
    assert after("x" * TG.MAX_LINE)[0] == "\n"


def _naive_mass(lines, partial: bytes) -> np.ndarray:
    """``edit_mass`` cell by cell: the edit distance of ``partial`` to every prefix."""
    best, found = None, []
    for i, (c, _) in enumerate(lines):
        for j in range(len(c) + 1):
            a, b = partial, c[:j]
            d = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
            for x in range(len(a) + 1):
                for y in range(len(b) + 1):
                    d[x][y] = x + y if x == 0 or y == 0 else min(
                        d[x - 1][y] + 1, d[x][y - 1] + 1, d[x - 1][y - 1] + (a[x - 1] != b[y - 1]))
            if best is None or d[-1][-1] < best:
                best, found = d[-1][-1], []
            if d[-1][-1] == best:
                found.append((i, j))
    mass = np.zeros(TG.VOCAB)
    for i, j in found:
        c, w = lines[i]
        mass[c[j] if j < len(c) else TG.NEWLINE] += w / sum(1 for k, _ in found if k == i)
    return mass


def test_edit_alignment_against_a_slow_reference():
    rng = np.random.default_rng(5)
    alphabet = np.frombuffer(b"ab= 1", dtype=np.uint8)

    def word(lo, hi):
        return rng.choice(alphabet, size=int(rng.integers(lo, hi))).tobytes()

    ties = 0
    for _ in range(80):
        lines = [(word(1, 7), float(rng.random()) + 0.1) for _ in range(int(rng.integers(1, 4)))]
        partial = word(0, 7)
        mass = TG.edit_mass(lines, partial)
        np.testing.assert_allclose(mass, _naive_mass(lines, partial), atol=1e-12)
        ties += (mass > 0).sum() > 1
    assert ties > 10


def test_on_the_grammar_the_direct_path_is_the_edit_path():
    lines = [(line.encode(), w) for line, w in G.lines_of(STORY, G.start(STORY))]
    for line, _ in lines:
        for t in range(len(line) + 1):
            np.testing.assert_allclose(TG.alignment_mass(lines, line[:t]),
                                       TG.edit_mass(lines, line[:t]), atol=1e-12)


def test_greedy_target_is_accurate_and_the_draft_clearly_less(pair):
    problems = pair.problems["test"]
    prompts = TP.pad_prompts([p.prompt for p in problems], pair.config.context_len)
    answers = [p.answer for p in problems]
    target = greedy.accuracy(pair.target, prompts, answers, DelimiterChecker(), 300)
    draft = greedy.accuracy(pair.draft, prompts, answers, DelimiterChecker(), 300)
    assert target["accuracy"] >= 0.9 and target["unfinished"] == 0
    assert draft["accuracy"] <= target["accuracy"] - 0.5
    assert 20 < target["mean_tokens"] < 200
    text = target["texts"][0].decode()
    assert DelimiterChecker().extract(text) == answers[0] and "\0" not in text


def test_greedy_generation_stops_at_the_end_byte_or_the_limit(pair):
    prompts = TP.pad_prompts([PROMPT], pair.config.context_len)
    texts, length = greedy.generate(pair.target, prompts, 300)
    assert texts[0].endswith(b"#### 35\n") and length[0] == len(texts[0]) + 1
    texts, length = greedy.generate(pair.target, prompts, 5)
    assert length[0] == 5 and len(texts[0]) == 5


def test_the_decoder_decodes_with_the_pair_and_records_valid_traces(pair):
    cfg = pair.config
    prompts, rngs = TP.prompts_of(pair, "valid", 4)
    cols, accepted = decode(pair, prompts, rngs, 6)
    g, k, C = cfg.block_size, cfg.top_k, cfg.context_len
    meta = {"format_version": T.SLOT_VERSION, "rows": len(cols["draft_prob"]), "name": "valid",
            "block_size": g, "top_k": k, "context_len": C, "config": cfg.to_dict()}
    ts = T.TraceSplit(cols, meta, name="valid")
    T.validate(ts, "<task traces>")
    assert len(ts) == 4 * 6 * g and accepted.shape == (4, 6)
    assert 0 < accepted.mean() < g
    again, _ = decode(pair, *TP.prompts_of(pair, "valid", 4), 6)
    assert all(np.array_equal(cols[f], again[f]) for f in cols)


def test_same_seed_same_pair_another_seed_another(pair):
    again = TP.build_pair(SMALL)
    other = TP.build_pair(TP.TaskPairConfig(**{**SMALL.to_dict(), "seed": 1}))
    assert again.problems == pair.problems and other.problems != pair.problems
    H = TP.pad_prompts([p.prompt + "First, " for p in pair.problems["valid"]],
                       SMALL.context_len)
    assert np.array_equal(again.draft.probs(H), pair.draft.probs(H))
    assert not np.array_equal(other.draft.probs(H), pair.draft.probs(H))
    assert pair.draft.probs(H).min() > 0


@pytest.mark.parametrize("field, value", [
    ("draft_order", 0), ("draft_order", 8), ("temperature", 0.0), ("floor", 0.0),
    ("floor", 0.01), ("block_size", 0), ("top_k", 257), ("context_len", 5000),
    ("train_prompts", 0), ("seed", -1), ("draft_samples", 1.5), ("draft_samples", 0),
    ("draft_samples", 17), ("temperature", float("nan")),
])
def test_a_bad_configuration_is_refused_naming_the_field(field, value):
    with pytest.raises(TraceConfigError) as e:
        TP.TaskPairConfig(**{**SMALL.to_dict(), field: value}).validate()
    assert e.value.field == field


def test_a_context_too_small_for_a_problem_is_refused():
    with pytest.raises(TraceConfigError, match="context_len=200 is too small; train problem 0"):
        TP.build_pair(TP.TaskPairConfig(train_prompts=5, valid_prompts=1, test_prompts=1,
                                        context_len=200))


def test_prompts_are_left_padded_to_the_context():
    out = TP.pad_prompts(["ab", b"xyz"], 5)
    assert out.tolist() == [[0, 0, 0, 97, 98], [0, 0, 120, 121, 122]]
    with pytest.raises(ValueError, match="prompt 0 has 6 bytes"):
        TP.pad_prompts(["abcdef"], 5)


def test_the_standard_rule_keeps_the_task(pair):
    """Speculative sampling with the standard rule emits the target's own samples:
    every solution ends and is right."""
    prompts, rngs = TP.prompts_of(pair, "test", 8)
    _, _, hist, lens = decode(pair, prompts, rngs, 100, history=True)
    C = pair.config.context_len
    for row, n, p in zip(hist, lens, pair.problems["test"]):
        text = row[C:n].tobytes()
        assert b"\0" in text
        assert DelimiterChecker().check(text.split(b"\0", 1)[0].decode(), p.answer)
