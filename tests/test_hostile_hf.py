"""Hostile inputs to the Hugging Face backend (`evolve data trace --backend hf`, and
`evolve simulate --compare` on hf traces, which loads the recorded models): a prompts
file that is not a small regular file of sane JSON lines, configurations beyond the
n-gram backend's bounds, a tokenizer larger than the models' output layer, weights
that would be unpickled, a device out of memory while the models load, and two
recordings into one directory. Every refusal is one line, exit code 2, before any
model loads where the input allows, and leaves nothing behind. Tiny models of
tests/hfkit.py, no network.

Guarantee 21 of docs/reliability.md, Hugging Face traces: everything is checked before a model loads, and nothing is unpickled:

`evolve data trace --backend hf` holds its configuration to the n-gram backend's
bounds (prompts per split, blocks per prompt, prompt length, rows per split), caps
`--top-k` and `--context-len` at what a trace file may declare (2^20) and refuses a
split that would be larger than a split file can hold, naming the option; a prompts
file's own counts meet the same bounds. These checks, the prompts, an `--out` that
is not a directory, and the model directories' weight files are all checked before
any model or tokenizer loads, so a refusal costs no model load and leaves no
directory behind. The `--prompts` file is read by the one JSON reader's rules
(`evolve/io/jsonio.py`): a regular file only (a FIFO, a device or a directory is
refused unopened), at most 64 MiB read with that cap, lines of at most 2^20
characters, nesting, NaN and huge integers refused as everywhere, and a lone
surrogate in a text refused naming the file and line; `--corpus` files are regular
files read with a cap. Weights load from safetensors only: a pickled file named by
`transformers_weights` in config.json, a non-safetensors shard in an index's
`weight_map`, or a pickled checkpoint with no safetensors beside it is refused in
one line naming the file, and while a model loads `torch.load` refuses instead of
reading (hub ids, file names a later transformers may add). A checkpoint that lacks
some of the model's weights (which would be random) is refused; a tokenizer with
more tokens than either model's output layer is refused; running out of memory while
a model loads or moves to the device (`torch.OutOfMemoryError`,
`torch.AcceleratorError`), or while recording, is one line, for `data trace` and
`simulate --compare` alike; transformers' load report and progress bars are silenced
during the load. Tests (`tests/test_hostile_hf.py`):
`test_hostile_prompt_lines_are_one_line_errors[deep|surrogate|nan|not utf-8|split]`,
`test_prompts_that_are_not_a_regular_file_are_refused_unread[fifo|device|directory]`
, `test_prompts_file_and_its_lines_are_capped`,
`test_corpus_files_are_read_with_a_cap`,
`test_options_beyond_the_bounds_are_refused_before_loading[...]`,
`test_a_split_too_large_to_read_back_is_refused_before_loading`,
`test_prompts_file_counts_are_held_to_the_row_bound`,
`test_out_that_is_a_file_is_refused_before_loading`,
`test_a_tokenizer_larger_than_the_output_layer_is_refused`,
`test_weights_named_by_config_json_are_never_unpickled`,
`test_pickled_shards_named_by_an_index_are_never_unpickled`,
`test_unpickling_during_a_load_is_refused_even_unforeseen`,
`test_a_checkpoint_missing_weights_is_refused`,
`test_out_of_memory_while_loading_is_one_line[oom|accelerator]`,
`test_out_of_memory_while_compare_loads_is_one_line[oom|accelerator]`,
`test_out_of_memory_while_compare_decodes_is_one_line[oom|accelerator]`,
`test_compare_reads_the_recorded_prompts_file_bounded`,
`test_prompt_file_bounds_are_one_line_before_loading[...]` (an empty text, a line
that is not an object, a split left without prompts),
`test_prompts_and_corpus_together_or_a_small_corpus_are_refused_before_loading`,
`test_prompts_the_tokenizer_cannot_use_are_one_line` (corpus files shorter than
`--prompt-len`, a prompt of no tokens, `--top-k` beyond the vocabulary),
`test_a_model_saved_with_safetensors_only_loads_and_records[one file|sharded]` (and
nothing is unpickled), `test_the_load_report_of_transformers_is_not_printed` (slow,
a real subprocess).

Also guarantee 22 of docs/reliability.md, A trace recording owns its output directory
(test_a_second_recording_into_a_locked_directory_is_refused,
test_force_keeps_the_replaced_traces_in_previous): see tests/test_cli_trace.py.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from evolve.data.sources import hf, ngram# noqa: E402
from evolve.data.sources.hf import models as hf_models, prompts as hf_prompts  # noqa: E402
from evolve.io.lock import DirLock  # noqa: E402
from tests import clikit, hfkit  # noqa: E402
from tests.clikit import one_line_error  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
ENV = hfkit.ENV


invoke = hfkit.invoke
models = hfkit.models_fixture()


def trace(target, draft, prompts, out, *extra):
    return invoke("data", "trace", "--backend", "hf", "--target", target, "--draft", draft,
                  "--prompts", prompts, "--block-size", 3, "--top-k", 8,
                  "--blocks-per-prompt", 2, "--batch-size", 6, "--out", out, *extra)


def corpus_trace(models, corpus, out, *extra):
    target, draft, _ = models
    return invoke("data", "trace", "--backend", "hf", "--target", target, "--draft", draft,
                  "--corpus", corpus, "--prompt-len", 8, "--out", out, *extra)


@pytest.fixture
def no_loading(monkeypatch):
    """Loading a model or a tokenizer fails the test: the refusal must come first."""
    def refuse(*args, **kwargs):
        raise AssertionError("a model or tokenizer was loaded before the refusal")
    monkeypatch.setattr(hf_models, "load_model", refuse)
    monkeypatch.setattr(hf_models, "load_tokenizer", refuse)


@pytest.fixture
def corpus(tmp_path):
    d = tmp_path / "corpus"
    d.mkdir()
    for i in range(6):
        (d / f"f{i}.txt").write_text("".join(f"line {j} of file {i}\n" for j in range(20)))
    return d


@pytest.fixture(scope="module")
def recorded(models, tmp_path_factory):
    """Traces of the tiny pair (their own prompts file, which a test may replace)."""
    root = tmp_path_factory.mktemp("hf_recorded")
    prompts = shutil.copy(models[2], root / "prompts.jsonl")
    out = root / "traces"
    r = trace(models[0], models[1], prompts, out)
    assert r.exit_code == 0, r.output
    return out, Path(prompts)


# ------------------------------------------------------------------ the prompts file

GOOD = json.dumps({"text": "def f(x):"}) + "\n"
HOSTILE_LINES = {
    "deep": ('{"text": "x", "more": ' + "[" * 100_000 + "]" * 100_000 + "}",
             ("line 2", "nested too deeply")),
    "surrogate": ('{"text": "a\\ud800b"}', ("line 2", "lone surrogate", "\\ud800")),
    "nan": ('{"text": "x", "weight": NaN}', ("line 2", "not valid JSON")),
    "not utf-8": (b'{"text": "caf\xe9"}', ("line 2", "not UTF-8")),
    "split": ('{"text": "x", "split": ["train"]}', ("line 2", "'split'")),
}


@pytest.mark.parametrize("kind", sorted(HOSTILE_LINES))
def test_hostile_prompt_lines_are_one_line_errors(models, tmp_path, no_loading, kind):
    line, needles = HOSTILE_LINES[kind]
    f = tmp_path / "prompts.jsonl"
    f.write_bytes(GOOD.encode() + (line if isinstance(line, bytes) else line.encode()) + b"\n")
    out = tmp_path / "out"
    one_line_error(trace(models[0], models[1], f, out), str(f), *needles)
    assert not out.exists()


@pytest.mark.parametrize("kind", ["fifo", "device", "directory"])
def test_prompts_that_are_not_a_regular_file_are_refused_unread(models, tmp_path, no_loading,
                                                                 kind):
    f = tmp_path / "prompts.jsonl"
    if kind == "fifo":
        os.mkfifo(f)                        # reading it would wait for a writer forever
    elif kind == "device":
        f.symlink_to("/dev/zero")           # reading it never ends
    else:
        f.mkdir()
    out = tmp_path / "out"
    one_line_error(trace(models[0], models[1], f, out), str(f), "not a regular file")
    assert not out.exists()


def test_prompts_file_and_its_lines_are_capped(models, tmp_path, monkeypatch, no_loading):
    f = tmp_path / "prompts.jsonl"
    f.write_text(GOOD + json.dumps({"text": "y" * 300}) + "\n")
    out = tmp_path / "out"
    monkeypatch.setattr(hf_prompts, "MAX_LINE_CHARS", 200)
    one_line_error(trace(models[0], models[1], f, out), str(f), "line 2", "more than 200")
    monkeypatch.setattr(hf_prompts, "MAX_PROMPTS_BYTES", 100)
    one_line_error(trace(models[0], models[1], f, out), str(f), "larger than 100")
    assert not out.exists()


def test_corpus_files_are_read_with_a_cap(models, corpus, tmp_path, monkeypatch, no_loading):
    os.mkfifo(corpus / "pipe")              # not a regular file: never opened
    monkeypatch.setattr(hf_prompts, "MAX_CORPUS_FILE_BYTES", 100)
    cfg = hf.HFTraceConfig(target="t", draft="d", corpus_dir=str(corpus))
    with pytest.raises(hf_prompts.DataError, match="larger than 100"):
        hf_prompts.load_corpus(cfg)
    c = hf_prompts.load_corpus(hf.HFTraceConfig(target="t", draft="d", corpus_dir=str(corpus),
                                                max_bytes_per_file=50))
    assert len(c) == 6 and all(len(doc) == 50 for doc in c.docs)


# ------------------------------------------------------------------ bounds, before loading

@pytest.mark.parametrize("option,value", [
    ("--train-prompts", 10 ** 8), ("--context-len", 10 ** 8), ("--context-len", 2 * 10 ** 6),
    ("--blocks-per-prompt", 10 ** 6), ("--prompt-len", 10 ** 7), ("--seed", 2 ** 63),
    ("--batch-size", 10 ** 9)])
def test_options_beyond_the_bounds_are_refused_before_loading(models, corpus, tmp_path,
                                                               no_loading, option, value):
    out = tmp_path / "out"
    one_line_error(corpus_trace(models, corpus, out, option, value), option, str(value))
    assert not out.exists()


def test_a_split_too_large_to_read_back_is_refused_before_loading(models, corpus, tmp_path,
                                                                   no_loading):
    out = tmp_path / "out"
    r = corpus_trace(models, corpus, out, "--train-prompts", 100_000, "--context-len", 2 ** 20)
    one_line_error(r, "--context-len", "GiB")
    assert not out.exists()


def test_prompts_file_counts_are_held_to_the_row_bound(models, tmp_path, monkeypatch,
                                                       no_loading):
    monkeypatch.setattr(ngram, "MAX_SPLIT_ROWS", 20)     # the file's train split: 36 rows
    out = tmp_path / "out"
    one_line_error(trace(*models, out), "--prompts", str(models[2]), "rows per split")
    assert not out.exists()


def test_out_that_is_a_file_is_refused_before_loading(models, tmp_path, no_loading):
    out = tmp_path / "out"
    out.write_text("mine")
    one_line_error(trace(*models, out), "--out", str(out), "not a directory")
    assert out.read_text() == "mine"


PROMPT_FILE_BOUNDS = {
    "empty text": ('{"text": "def f(x):"}\n{"text": ""}\n', ("line 2", "'text'")),
    "not an object": ('{"text": "def f(x):"}\n[1, 2]\n', ("line 2", "'text'")),
    "a split with no prompts": ('{"text": "a"}\n{"text": "b"}\n{"text": "c"}\n',
                                ("test split has no prompts",)),
    "a labelled split left empty": ('{"text": "a", "split": "train"}\n'
                                    '{"text": "b", "split": "valid"}\n',
                                    ("test split has no prompts",)),
}


@pytest.mark.parametrize("kind", sorted(PROMPT_FILE_BOUNDS))
def test_prompt_file_bounds_are_one_line_before_loading(models, tmp_path, no_loading, kind):
    """What a prompts file must hold (a non-empty text per line, every split some
    prompts): one line naming the file, before any model loads, nothing left behind."""
    text, needles = PROMPT_FILE_BOUNDS[kind]
    f = tmp_path / "prompts.jsonl"
    f.write_text(text)
    out = tmp_path / "out"
    one_line_error(trace(models[0], models[1], f, out), str(f), *needles)
    assert not out.exists()


def test_prompts_and_corpus_together_or_a_small_corpus_are_refused_before_loading(
        models, corpus, tmp_path, no_loading):
    out = tmp_path / "out"
    one_line_error(trace(models[0], models[1], models[2], out, "--corpus", corpus),
                   "--prompts", "not both")
    for f in sorted(corpus.iterdir())[3:]:
        f.unlink()                                  # three files: too few to split
    one_line_error(corpus_trace(models, corpus, out), str(corpus), "at least 4")
    assert not out.exists()


def test_prompts_the_tokenizer_cannot_use_are_one_line(models, corpus, tmp_path, monkeypatch):
    """Checked once the tokenizer is there: corpus files shorter than --prompt-len
    tokens, a prompt that becomes no tokens, and --top-k beyond the vocabulary."""
    out = tmp_path / "out"
    one_line_error(corpus_trace(models, corpus, out, "--prompt-len", 5000), "shorter than",
                   "--prompt-len 5000")
    one_line_error(trace(models[0], models[1], models[2], out, "--top-k", 300), "--top-k",
                   "300", "1..256")
    real = hf_prompts.encode
    monkeypatch.setattr(hf_prompts, "encode", lambda tok, text: real(tok, text)[:0]
                        if text == hfkit.PROMPTS[0] else real(tok, text))
    one_line_error(trace(*models, out), str(models[2]), "has no tokens")
    assert not out.exists()


# ------------------------------------------------------------------ vocabularies

def test_a_tokenizer_larger_than_the_output_layer_is_refused(models, tmp_path):
    target = hfkit.save_model(tmp_path / "t", 1, hfkit.TARGET, extra_tokens=4)
    draft = hfkit.save_model(tmp_path / "d", 2, hfkit.DRAFT, extra_tokens=4)
    out = tmp_path / "new" / "out"
    r = trace(target, draft, models[2], out)
    one_line_error(r, "--target", str(target), "260 tokens", "256 ids")
    assert not (tmp_path / "new").exists()         # refused: no directory left behind


# ------------------------------------------------------------------ weights

def _pickled_copy(models, root: Path, name: str) -> Path:
    """The draft's directory with its weights also saved with torch.save (pickle)."""
    from safetensors.torch import load_file
    d = shutil.copytree(models[1], root / name)
    torch.save(load_file(d / "model.safetensors"), d / "weights.bin")
    return Path(d)


@pytest.fixture
def torch_load_calls(monkeypatch):
    calls = []
    real = torch.load

    def spy(f, *args, **kwargs):
        calls.append(str(f))
        return real(f, *args, **kwargs)
    monkeypatch.setattr(torch, "load", spy)
    return calls


@pytest.mark.parametrize("layout", ["one file", "sharded"])
def test_a_model_saved_with_safetensors_only_loads_and_records(models, tmp_path,
                                                               torch_load_calls, layout):
    """The refusals above must not refuse the good case: a tiny random GPT-2 saved with
    safetensors only (one file, or shards with their index) loads and records, and
    nothing is unpickled."""
    from transformers import GPT2LMHeadModel
    d = tmp_path / "draft"
    GPT2LMHeadModel.from_pretrained(models[1]).save_pretrained(
        d, safe_serialization=True, max_shard_size="40KB" if layout == "sharded" else "10GB")
    for f in Path(models[1]).iterdir():            # the tokenizer's files
        if not f.name.endswith((".safetensors", ".json")) or "token" in f.name:
            shutil.copy(f, d / f.name)
    weights = sorted(f.name for f in d.iterdir() if f.name.endswith(hf_models.SAFE))
    assert not [f for f in d.iterdir() if f.name.endswith(hf_models.PICKLED)]
    assert (len(weights) > 2) == (layout == "sharded"), weights
    out = tmp_path / "out"
    r = trace(models[0], d, models[2], out)
    assert r.exit_code == 0, r.output
    from evolve.data import traces
    assert len(traces.load(out / "train.npz")) > 0
    assert torch_load_calls == []


def test_weights_named_by_config_json_are_never_unpickled(models, tmp_path, torch_load_calls):
    d = _pickled_copy(models, tmp_path, "explicit")
    (d / "weights.bin").rename(d / "adapter_model.bin")
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "transformers_weights":
                                               "adapter_model.bin"}))
    out = tmp_path / "out"
    one_line_error(trace(models[0], d, models[2], out), "--draft", "adapter_model.bin",
                   "transformers_weights", "safetensors only")
    assert torch_load_calls == [] and not out.exists()


def test_pickled_shards_named_by_an_index_are_never_unpickled(models, tmp_path,
                                                             torch_load_calls):
    d = _pickled_copy(models, tmp_path, "sharded")
    from safetensors.torch import load_file
    keys = sorted(load_file(d / "model.safetensors"))
    (d / "model.safetensors").unlink()
    (d / "weights.bin").rename(d / "model-00001-of-00001.bin")
    (d / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {k: "model-00001-of-00001.bin" for k in keys}}))
    out = tmp_path / "out"
    one_line_error(trace(models[0], d, models[2], out), "--draft", "model-00001-of-00001.bin",
                   "weight_map", "safetensors only")
    assert torch_load_calls == [] and not out.exists()


def test_unpickling_during_a_load_is_refused_even_unforeseen(models, tmp_path, monkeypatch,
                                                             torch_load_calls):
    """The last guard: what the checks of the directory do not foresee (a hub id, a
    file name of a later transformers) still never reaches torch.load."""
    d = _pickled_copy(models, tmp_path, "unforeseen")
    (d / "weights.bin").rename(d / "adapter_model.bin")
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "transformers_weights":
                                               "adapter_model.bin"}))
    monkeypatch.setattr(hf_models, "check_weights", lambda option, name: None)
    with pytest.raises(hf.HFTraceError, match="would unpickle .*adapter_model.bin"):
        hf_models.load_model("--draft", str(d), "cpu", "float32")
    assert torch_load_calls == []


def test_a_checkpoint_missing_weights_is_refused(models, tmp_path):
    """Weights missing from the checkpoint would be random: refused, in one line (the
    load report of transformers is not printed)."""
    d = shutil.copytree(models[1], tmp_path / "short")
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "n_layer": 2}))
    out = tmp_path / "out"
    one_line_error(trace(models[0], d, models[2], out), "--draft", "weights are missing",
                   "transformer.h.1.")
    assert not out.exists()


# ------------------------------------------------------------------ out of memory

def _oom_on_move(monkeypatch, kind):
    def move(self, *args, **kwargs):
        if kind == "oom":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
        raise torch.AcceleratorError("CUDA error: out of memory")
    monkeypatch.setattr(torch.nn.Module, "to", move)


@pytest.mark.parametrize("kind", ["oom", "accelerator"])
def test_out_of_memory_while_loading_is_one_line(models, tmp_path, monkeypatch, kind):
    _oom_on_move(monkeypatch, kind)
    out = tmp_path / "out"
    one_line_error(trace(*models, out), "--target", str(models[0]), "out of memory")
    assert not out.exists()


@pytest.mark.parametrize("kind", ["oom", "accelerator"])
def test_out_of_memory_while_compare_loads_is_one_line(recorded, monkeypatch, kind):
    _oom_on_move(monkeypatch, kind)
    r = invoke("simulate", "--compare", "standard_rejection", "--compare", "leniency:0.5",
               "--data", recorded[0], "--prompts", 2, "--blocks", 1)
    one_line_error(r, "out of memory")


@pytest.mark.parametrize("kind", ["oom", "accelerator"])
def test_out_of_memory_while_compare_decodes_is_one_line(recorded, monkeypatch, kind):
    from evolve.freerun import paired

    def decode(*args, **kwargs):
        if kind == "oom":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
        raise torch.AcceleratorError("CUDA error: out of memory")
    monkeypatch.setattr(paired, "compare", decode)
    r = invoke("simulate", "--compare", "standard_rejection", "--compare", "leniency:0.5",
               "--data", recorded[0], "--prompts", 2, "--blocks", 1)
    one_line_error(r, "--prompts 2, --blocks 1", "out of memory")


def test_compare_reads_the_recorded_prompts_file_bounded(models, tmp_path):
    prompts = shutil.copy(models[2], tmp_path / "prompts.jsonl")
    out = tmp_path / "traces"
    assert trace(models[0], models[1], prompts, out).exit_code == 0
    os.unlink(prompts)
    os.mkfifo(prompts)                          # read unguarded, it would hang
    r = invoke("simulate", "--compare", "standard_rejection", "--compare", "leniency:0.5",
               "--data", out, "--prompts", 2, "--blocks", 1)
    one_line_error(r, str(prompts), "not a regular file")


# ------------------------------------------------------------------ the output directory

def test_a_second_recording_into_a_locked_directory_is_refused(models, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    with DirLock(out):                          # another recording holds the directory
        one_line_error(trace(*models, out), "--out", str(out), "another process")
    assert list(out.iterdir()) == []
    assert trace(*models, out).exit_code == 0   # the lock is the only obstacle


def test_force_keeps_the_replaced_traces_in_previous(models, tmp_path):
    import hashlib
    out = tmp_path / "out"
    assert trace(*models, out).exit_code == 0
    old = {s: (out / f"{s}.npz").read_bytes() for s in ("train", "valid", "test")}
    one_line_error(trace(*models, out, "--seed", 1), "exists and differs", "--force")
    r = trace(*models, out, "--seed", 1, "--force")
    assert r.exit_code == 0, r.output
    for s, raw in old.items():
        kept = out / "previous" / f"{s}-{hashlib.sha256(raw).hexdigest()[:16]}.npz"
        assert kept.read_bytes() == raw and (out / f"{s}.npz").read_bytes() != raw
    assert sorted(p.name for p in (out / "previous").iterdir()) == sorted(
        f"{s}-{hashlib.sha256(raw).hexdigest()[:16]}.npz" for s, raw in old.items())


@pytest.mark.slow
def test_the_load_report_of_transformers_is_not_printed(models, tmp_path):
    """A checkpoint with a tensor the model does not use loads (transformers reports
    it in a table of many lines); a later refusal is still the only line on stderr."""
    from safetensors.torch import load_file, save_file
    d = Path(shutil.copytree(models[1], tmp_path / "extra"))
    weights = load_file(d / "model.safetensors")
    save_file({**weights, "unused.weight": torch.zeros(3)}, d / "model.safetensors",
              metadata={"format": "pt"})
    r = subprocess.run([sys.executable, "-m", "evolve", "data", "trace", "--backend", "hf",
                        "--target", str(models[0]), "--draft", str(d), "--prompts",
                        str(models[2]), "--blocks-per-prompt", "500", "--out",
                        str(tmp_path / "out")], cwd=REPO, capture_output=True, text=True,
                       timeout=300, env={**os.environ, **clikit.ENV, **ENV})
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "at most 256" in lines[0], \
        r.stderr
