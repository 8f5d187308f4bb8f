"""Your own task with your own pair (evolve.data.sources.task.hf_pair, evolve data task
--task-file): on the tiny random-init GPT-2 pair of tests/hfkit.py whose tokenizer
ends a text at the token the target emits most, the model views against the models
reading the tokens alone, the labels against a direct greedy continuation, the
arbiter against the recording, determinism, and the refusals."""

import collections
import json
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from evolve.data import labels as LB  # noqa: E402
from evolve.data.sources.hf import device as DV  # noqa: E402
from evolve.data.sources.task import hf_pair as HT, record  # noqa: E402
from tests import hfkit, naive_labels  # noqa: E402
from tests.clikit import one_line_error  # noqa: E402

G, NEW, REGEX = 3, 12, r"(\d+)"
DEV = hfkit.test_device()      # torch's CPU, or the GPU with EVOLVE_TEST_ON_GPU=1


def _greedy(model, ids: list, n: int) -> list:
    """n tokens of the model's greedy continuation of ids, each from the tokens alone."""
    out = list(ids)
    with torch.inference_mode():
        for _ in range(n):
            out.append(int(model(torch.tensor([out], device=DEV)).logits[0, -1].argmax()))
    return out[len(ids):]


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    root = tmp_path_factory.mktemp("hf_task")
    target, draft = hfkit.tiny_pair(root)
    model = AutoModelForCausalLM.from_pretrained(target).eval().to(DEV)
    tok = AutoTokenizer.from_pretrained(target)
    seen = collections.Counter(_greedy(model, tok("Q: 1 + 2 = ?\nA:")["input_ids"], 24))
    end = seen.most_common(1)[0][0]
    for d in (target, draft):              # texts end at the target's favourite token
        t = AutoTokenizer.from_pretrained(d)
        t.eos_token = t.convert_ids_to_tokens(end)
        t.save_pretrained(d)
    path = root / "task.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"Q: {i} + {2 * i} = ?\nA:",
                                        "answer": 3 * i}) + "\n" for i in range(24)))
    cfg = HT.HFTaskConfig(target=str(target), draft=str(draft), task_file=str(path),
                          block_size=G, max_new_tokens=NEW, delimiter=None,
                          answer_regex=REGEX, batch_size=5, device=DEV)
    return SimpleNamespace(root=root, target=target, draft=draft, path=path, end=end,
                           cfg=cfg, pair=HT.build_pair(cfg), model=model)


def test_a_view_reads_a_left_padded_history_as_the_model_reads_its_tokens(task):
    pair = task.pair
    H, _ = pair.prompts("train")
    H[1, -3:] = -1                              # shorter histories in the same batch
    H[1] = np.roll(H[1], 3)
    P = pair.target.probs(H)
    for h, p in zip(H, P):
        ids = torch.tensor([h[h != HT.PAD].tolist()], device=DEV)
        with torch.inference_mode():
            alone = DV.probs(task.model(ids).logits[0, -1], pair.vocab, 1.0).cpu().numpy()
        np.testing.assert_allclose(p, alone, rtol=1e-5, atol=1e-9)
    assert pair.end == task.end and pair.context_len == max(
        len(pair.encode(p.prompt)) for s in pair.problems.values() for p in s) + NEW + G + 1


@pytest.fixture(scope="module")
def greedy(task):
    return record.record_split(task.pair, "valid", "greedy", 0)


def test_texts_end_at_the_end_token_or_the_budget(task, greedy):
    cols = greedy.traces.columns
    assert cols["context"].dtype == np.int32 and cols["cand_token"].dtype == np.int32
    early = 0
    for s in np.unique(cols["sequence"]):
        last = np.flatnonzero(cols["sequence"] == s)[-G:]      # the text's last block
        keep = cols["token"][last] == cols["target_top"][last]  # greedy standard decisions
        n_acc = G if keep.all() else int(np.argmin(keep))
        total = int(cols["position"][last[0]]) + n_acc + 1
        if total < NEW:                     # ended before its budget: by the end token
            early += 1
            emitted = list(cols["token"][last[:n_acc]]) + (
                [int(cols["target_top"][last[n_acc]])] if n_acc < G else [])
            assert task.end in emitted or n_acc == G, (s, emitted)
        assert int(cols["position"][last[0]]) < NEW    # the block began within the budget
    assert early >= 1                       # some texts end before their budget


def test_labels_match_a_direct_greedy_continuation_of_the_generated_text(task, greedy):
    pair, cols, crit = task.pair, greedy.traces.columns, greedy.critical
    rows = np.flatnonzero(crit >= 0)
    assert rows.size > 8 and 0 < (crit[rows] == 1).sum() < rows.size
    for r in rows[np.linspace(0, rows.size - 1, 12).astype(int)]:
        ctx = cols["context"][r]
        ctx = ctx[ctx != HT.PAD].tolist()
        pos = int(cols["position"][r])
        answers = []
        for tok in (int(cols["token"][r]), int(cols["target_top"][r])):
            text = ctx[len(ctx) - pos:] + [tok]
            if tok != pair.end:
                more = _greedy(task.model, ctx + [tok], min(NEW, NEW - 1 - pos))
                text += more[:more.index(pair.end) + 1] if pair.end in more else more
            answers.append(pair.checker.extract(pair.body(text)))
        assert crit[r] == int(answers[0] != answers[1]), (r, answers)


@pytest.mark.parametrize("decoding", ["greedy", "sample"])
def test_the_cached_decoder_decodes_as_whole_history_reads(task, decoding):
    """The pair's KV-cached decoder (``HFTaskPair.decode``, the Hugging Face recorder)
    and the numpy decoder reading whole histories through the model views decode the
    same problems with the same uniforms alike: the same drafts, decisions, accepted
    counts, texts and ends, and every recorded column to float rounding; with a rule
    too."""
    from evolve.data.decode import decode
    from evolve.rules.adapters import named_rule
    pair, greedy = task.pair, decoding == "greedy"
    kw = dict(greedy=greedy, end=pair.end, max_tokens=pair.max_tokens)
    H, rngs = pair.prompts("valid")
    got, acc = pair.decode(H, rngs, NEW, record=True, **kw)
    H, rngs = pair.prompts("valid")
    want, acc_w = decode(pair, H, rngs, NEW, batch=pair.batch, record=True, **kw)
    assert np.array_equal(acc, acc_w) and (acc == -1).any() and (acc > 0).any()
    assert set(got) == set(want) and np.array_equal(got["live"], want["live"])
    live = want["live"]             # rows of blocks after a text's end are not kept
    for f in want:
        if want[f].dtype.kind in "iub":
            assert np.array_equal(got[f][live], want[f][live]), f
        else:
            np.testing.assert_allclose(got[f][live], want[f][live], rtol=1e-5, atol=1e-7,
                                       err_msg=f)
    rule = named_rule("leniency", 0.5, greedy)[0]
    H, rngs = pair.prompts("valid")
    _, acc, hist, lens = pair.decode(H, rngs, NEW, rule=rule, record=False, history=True, **kw)
    H, rngs = pair.prompts("valid")
    _, acc_w, hist_w, lens_w = decode(pair, H, rngs, NEW, batch=pair.batch, rule=rule,
                                      record=False, history=True, **kw)
    assert np.array_equal(acc, acc_w) and np.array_equal(lens, lens_w)
    for h, w, n in zip(hist, hist_w, lens):
        assert np.array_equal(h[:n], w[:n])


def test_the_answer_oracle_decodes_as_with_whole_history_reads(task):
    """The answer oracle (evolve.rules.oracle) in the pair's KV-cached decoder decides as
    in the numpy decoder reading whole histories through the model views: in greedy
    decoding (where it draws no uniforms) the same accepted counts and texts, drafts
    the lossless rule rejects among what it keeps, and every answer the lossless one."""
    from evolve.data.decode import decode
    from evolve.rules.oracle import AnswerOracle
    pair = task.pair
    kw = dict(greedy=True, end=pair.end, max_tokens=pair.max_tokens, record=False,
              history=True)
    runs = {}
    for name in ("cached", "views", "lossless"):
        H, rngs = pair.prompts("valid")
        oracle = AnswerOracle() if name != "lossless" else None
        if name == "views":
            out = decode(pair, H, rngs, NEW, batch=pair.batch, rule=oracle, **kw)
        else:
            out = pair.decode(H, rngs, NEW, rule=oracle, **kw)
        runs[name] = (out, oracle)
    (_, acc, hist, lens), oracle = runs["cached"]
    (_, acc_w, hist_w, lens_w), oracle_w = runs["views"]
    assert np.array_equal(acc, acc_w) and np.array_equal(lens, lens_w)
    # the numpy decoder also asks about the sequences that have ended (kept: their texts
    # are done), the cached one about the live ones only
    assert 0 < oracle.kept < oracle.judged and oracle.judged <= oracle_w.judged
    assert oracle_w.judged - oracle.judged == oracle_w.kept - oracle.kept
    (_, acc_l, hist_l, lens_l), _ = runs["lossless"]
    C = H.shape[1]
    for h, n, h_l, n_l in zip(hist, lens, hist_l, lens_l):
        assert pair.answer_of(h[C:n].tolist()) == pair.answer_of(h_l[C:n_l].tolist())
    for h, w, n in zip(hist, hist_w, lens):
        assert np.array_equal(h[:n], w[:n])


@pytest.mark.parametrize("decoding", ["greedy", "sample"])
def test_cached_continuations_are_the_whole_history_ones(task, greedy, decoding):
    """The miner's continuations with the target's KV cache (the pair's
    ``continuation_reader``) give the texts and counted passes of
    ``evolve.data.labels.continue_text`` reading each whole history at every step
    (through the model view, for a pair without that reader)."""
    cols = greedy.traces.columns
    rows = np.flatnonzero(greedy.critical >= 0)[:40]
    hist = np.concatenate([cols["context"][rows], cols["token"][rows, None].astype(np.int32)], 1)
    keep = cols["position"][rows] + 1
    limit = np.minimum(NEW, NEW - 1 - cols["position"][rows])
    u = np.random.default_rng(4).random((rows.size, NEW + 1))
    args = (decoding == "greedy", u, task.pair.done_of, limit, HT.PAD, keep)
    whole = SimpleNamespace(target=task.pair.target, context_len=task.pair.context_len)
    want = LB.continue_text(whole, hist, *args)
    got = LB.continue_text(task.pair, hist, *args)
    assert got == want and want[1] > rows.size
    assert len({len(t) for t in want[0]}) > 1          # texts of different lengths


@pytest.mark.parametrize("decoding", ["greedy", "sample"])
def test_mined_labels_are_the_first_miners_reading_whole_histories(task, greedy, decoding):
    """The pair's miner (reuse of the recording and of shared continuations, the KV cache
    dropping rows that have ended, the next token chosen on the device, batches of 16
    continuations) gives the labels of the first miner reading each whole history
    through the model view at every step, with fewer target rows. Planted, it fails:
    each step's tokens appended to the cache's rows in reverse order."""
    pair = task.pair
    ts = greedy.traces if decoding == "greedy" else record.record_traces(pair, "valid",
                                                                         "sample", 3)
    first = ts.columns["sequence"] < 3                  # the first three problems
    cols, g = {f: v[first] for f, v in ts.columns.items()}, decoding == "greedy"
    whole = SimpleNamespace(target=pair.target, context_len=pair.context_len)
    want, rows, _, _ = naive_labels.mine(whole, cols, pair.answer_of, pair.done_of, g, NEW,
                                         0, pad=HT.PAD, max_tokens=pair.max_tokens)
    got, cost = LB.mine(pair, cols, pair.answer_of, pair.done_of, g, NEW, 0, pad=HT.PAD,
                        max_tokens=pair.max_tokens, max_rows=16)
    assert np.array_equal(got, want) and 0 < (got == 1).sum() < (got >= 0).sum()
    assert cost["target_forward_rows"] < rows


def test_a_stop_string_ends_the_cached_decoders_texts(task):
    """With a stop string (a character the target writes often), the KV-cached decoder
    ends a text in the block where its text first holds it: the text before that block
    does not, the text does (or the budget ended it), and its answer is read before it.
    Planted, it fails: the decoder not reading ``done_of``."""
    from dataclasses import replace
    pair = task.pair
    H, rngs = pair.prompts("valid")
    _, _, hist, lens = pair.decode(H, rngs, NEW, record=False, history=True, greedy=True,
                                   end=pair.end, max_tokens=pair.max_tokens)
    made = [pair.body(h[pair.context_len:n]) for h, n in zip(hist, lens)]
    stop = collections.Counter("".join(made)).most_common(1)[0][0]
    pair = replace(pair, config=replace(pair.config, stop=(stop,)))
    H, rngs = pair.prompts("valid")
    _, acc, hist, lens = pair.decode(H, rngs, NEW, record=False, history=True, greedy=True,
                                     end=pair.end, max_tokens=pair.max_tokens)
    stopped = 0
    for h, n, a, full in zip(hist, lens, acc, made):
        text = h[pair.context_len:n].tolist()
        blocks = np.cumsum(a[a >= 0] + 1)
        assert not pair.done_of(text[:blocks[-2] if blocks.size > 1 else 0])
        assert pair.done_of(text) or len(text) >= NEW
        if stop in full:
            stopped += 1
            assert pair.body(text) == full[:full.index(stop)]
    assert stopped > 0


def test_recording_again_gives_the_same_columns_and_labels(task, greedy):
    again = record.record_split(task.pair, "valid", "greedy", 0)
    for f, v in greedy.traces.columns.items():
        assert np.array_equal(v, again.traces.columns[f]), f
    assert np.array_equal(greedy.critical, again.critical)
    assert LB.could_reject(greedy.traces.columns, True).sum() == (greedy.critical >= 0).sum()


def test_record_evolve_and_compare_from_the_command_line(task, tmp_path, monkeypatch):
    out = tmp_path / "task"
    monkeypatch.chdir(task.root)         # relative paths, read back from elsewhere below
    base = ("data", "task", "--task-file", task.path.name, "--target", task.target.name,
            "--draft", task.draft.name, "--max-new-tokens", NEW, "--block-size", G,
            "--answer-regex", REGEX, "--device", DEV)
    r = hfkit.invoke(*base, "--decoding", "sample", "--out", out)
    assert r.exit_code == 0, r.output
    monkeypatch.chdir(tmp_path)
    valid = record.load(out, "valid")
    assert valid.meta["task"]["source"] == "hf" and valid.meta["decoding"] == "sample"
    r = hfkit.invoke("run", "--data", out, "--objective", "task_speed", "--generations", 1,
                     "--population", 16, "--select-problems", 2, "--runs-dir", tmp_path / "runs")
    assert r.exit_code == 0, r.output
    r = hfkit.invoke("simulate-task", "--data", out, "--split", "valid", "--compare",
                     "lossless", "--compare", "leniency:0.5", "--json")
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    lossless = res["rules"]["lossless"]
    # the arbiter's lossless decode is the recording's: the same blocks per problem
    assert lossless["problems"] == len(task.pair.problems["valid"])
    assert lossless["calls_per_problem"] * lossless["problems"] == len(valid) / G
    assert res["rules"]["leniency(l=0.5)"]["tokens_per_call"] > lossless["tokens_per_call"]
    # the time model: by default the draft's cost measured on this pair, one decoding
    # step of each model; a number given instead is taken as it is
    tune = ("tradeoff", "--data", out, "--family", "leniency", "--prompts", 2,
            "--budget", 0.5, "--json")
    r = hfkit.invoke(*tune)
    assert r.exit_code == 0, r.output
    tm = json.loads(r.stdout)["time_model"]
    m = tm["measured"]
    assert tm["draft_cost"] == pytest.approx(m["draft_ms"] / m["target_ms"]) and m["draft_ms"] > 0
    assert tm["call_cost"] == pytest.approx(1 + G * tm["draft_cost"]) and m["reps"] == 20
    r = hfkit.invoke(*tune[:-1], "--oracle-prompts", 2)
    assert r.exit_code == 0 and "measured now on this machine" in r.output, r.output
    assert "the oracle decodes test" in r.output and "of oracle" in r.output, r.output
    r = hfkit.invoke(*tune, "--draft-cost", 0.5)
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["time_model"] == {"draft_cost": 0.5, "block_size": G,
                                                  "call_cost": 1 + G * 0.5}
    task.path.write_text(task.path.read_text() + json.dumps({"prompt": "Q?",
                                                             "answer": 1}) + "\n")
    try:
        r = hfkit.invoke("simulate-task", "--data", out, "--compare", "lossless")
        one_line_error(r, "changed since")
    finally:
        task.path.write_text("".join(task.path.read_text().splitlines(True)[:-1]))


def test_the_draft_cost_is_the_draft_step_over_the_target_step(task, monkeypatch):
    """evolve.data.sources.hf.clock: a draft made slower by 20 ms a call is timed at
    20 ms or more a step, and the cost is its step over the target's."""
    import functools
    import time
    from evolve.data.sources.hf import clock
    draft = task.pair.draft.model
    plain = draft.forward

    @functools.wraps(plain)                    # the signature the cache argument is read from
    def slow(*args, **kwargs):
        time.sleep(0.02)
        return plain(*args, **kwargs)

    monkeypatch.setattr(draft, "forward", slow)
    m = clock.draft_cost(task.pair.target.model, draft, task.pair.vocab, context=8, reps=3)
    assert m["draft_ms"] >= 20 and m["draft_cost"] == m["draft_ms"] / m["target_ms"]
    assert (m["context"], m["reps"], m["batch"]) == (8, 3, 1)


@pytest.mark.parametrize("args,needles", [
    (("--task-file", "T"), ("--target", "needed with --task-file")),
    (("--target", "M", "--draft", "M"), ("--task-file", "needed")),
    (("--delimiter", "##"), ("--delimiter", "only with --task-file")),
    (("--device", "cpu"), ("--device", "only with --task-file")),
    (("--task-file", "T", "--target", "M", "--draft", "D", "--answer-regex", "("),
     ("--answer-regex", "not a regular expression")),
    (("--task-file", "T", "--target", "M", "--draft", "D", "--max-new-tokens", 400),
     ("--max-new-tokens", "positions")),
    (("--task-file", "BAD", "--target", "M", "--draft", "D"), ("line 2", "'answer'")),
    (("--task-file", "T", "--target", "M", "--draft", "D", "--delimiter", "",
      "--max-new-tokens", NEW),
     ("--delimiter", "empty")),                  # was taken as the default, ####
    (("--task-file", "SURROGATE", "--target", "M", "--draft", "D"),
     ("line 1", "'prompt'", "lone surrogate")),
    (("--task-file", "GSM8K", "--target", "M", "--draft", "D", "--max-new-tokens", NEW),
     ("line 1", "'answer'", "the delimiter '####'", "keep only the text after")),
])
def test_refusals_are_one_line(task, tmp_path, args, needles):
    """Each refusal comes before anything is written; the --max-new-tokens one also
    before a model loads (test_positions_are_checked_before_the_models_load)."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a", "answer": 1}\n{"prompt": "b"}\n')
    surrogate = tmp_path / "surrogate.jsonl"      # JSON spells it, no tokenizer takes it
    surrogate.write_text('{"prompt": "Q\\ud800", "answer": 1}\n' + task.path.read_text())
    gsm8k = tmp_path / "gsm8k.jsonl"              # whole solutions as references
    gsm8k.write_text("".join(json.dumps({"prompt": p["prompt"],
                                         "answer": f"so {p['answer']} #### {p['answer']}"})
                             + "\n" for p in map(json.loads, task.path.read_text().splitlines())))
    subst = {"T": task.path, "M": task.target, "D": task.draft, "BAD": bad,
             "SURROGATE": surrogate, "GSM8K": gsm8k}
    r = hfkit.invoke("data", "task", "--out", tmp_path / "o", *[subst.get(a, a) for a in args])
    one_line_error(r, *needles)
    assert not (tmp_path / "o").exists()


def test_positions_are_checked_before_the_models_load(task, monkeypatch):
    """The prompts' tokens and the models' configurations say whether the context fits;
    loading both models first only to refuse them wasted their loading time."""
    import dataclasses

    from evolve.data.sources.hf import models as HM
    from evolve.data.sources.ngram import TraceConfigError
    monkeypatch.setattr(HM, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    with pytest.raises(TraceConfigError) as e:
        HT.build_pair(dataclasses.replace(task.cfg, max_new_tokens=400))
    assert e.value.field == "max_new_tokens" and "positions" in str(e.value)
