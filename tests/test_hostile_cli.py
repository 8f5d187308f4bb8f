"""Hostile options of `evolve simulate` (and `--compare`), `evolve export --out` and
`evolve tradeoff --png` (docs/reliability.md). Each test fails without the
behaviour it names.

Sizes that cannot fit are refused before any work: the tests replace the first
piece of work (rebuilding the n-gram pair, drawing the prompts, sweeping the rule
families) by a function that fails the test, so a refusal that comes too late,
or not at all, is a failure here and never a real allocation.

Guarantee 23 of docs/reliability.md, Simulations within their bounds:

`evolve simulate` and `simulate --compare` refuse, before the pair is rebuilt or
anything is decoded, what cannot fit: `--prompts` at most 1,000,000 and `--blocks`
at most 10,000 (the bounds of a trace build), `--contexts` and `--reps` at most
1,000,000 each, and for `--compare` at most 20,000,000 drafted positions per rule
(prompts x blocks x block size, as a trace split). The memory the run would allocate
is estimated from these options and the split's recorded configuration
(`evolve.freerun.simulate.simulation_bytes`, `evolve.freerun.paired.comparison_bytes`: the decode
uniforms, the recorded columns, the decoded text, the output sample's draws) and a
run that needs more than this machine's physical memory is refused (the physical
memory, not what happens to be free, so the same command gets the same answer on a
machine whatever else runs). Each refusal is one line naming the options and their
values (`--reps: 1000000000000 is invalid; expected at most 1,000,000`, `--prompts
1000000, --blocks 10000, ...: would need about 824 GiB of memory, more than this
machine's 23.5 GiB`), exit code 2. The library (`simulate.check_rule`,
`paired.compare`) raises `SizeError` the same way. Tests in
`tests/test_hostile_cli.py` replace rebuilding the pair, drawing prompts and
decoding by a failure, so a late refusal fails without allocating:
`test_absurd_simulation_sizes_are_one_line_before_any_work`,
`test_simulation_beyond_this_machines_memory_is_refused_naming_the_options`,
`test_comparison_beyond_its_rows_or_memory_is_refused`,
`test_library_refuses_sizes_before_any_work`; the estimates are checked against what
numpy allocates (tracemalloc) in
`test_memory_estimates_are_upper_bounds_of_what_is_allocated`. `--compare` rules are
checked the same way: an empty parameter (`leniency:`) or run name (`run:`) is
refused instead of meaning the default, and so is a parameter outside the range the
rules table states for it (`Rule.range`: `ears:-1`, `cactus:-1`, `leniency:2`;
`test_every_parameter_lies_in_its_stated_range_and_outside_it_is_refused`), and
every rule error names `--compare` and the rule as given, echoed shortened when it
is long (a 5,000-character `run:` name made a 5 KB line;
`test_a_long_compare_value_is_echoed_shortened`) (`named_rule` raises `RuleError`
naming the rule and the value; the command adds its option):
`test_compare_rule_errors_name_compare`,
`test_named_rule_errors_name_the_rule_not_an_option`.

Guarantee 24 of docs/reliability.md, Files written for the user are never clobbered:

`evolve export --out FILE` writes a new file only: an existing one is refused unless
`--force`, which first keeps it, complete, as `FILE.previous`, or as
`FILE.previous.1`, `.2`, ... when that exists, so no kept file is ever overwritten
and the original survives any number of `--force`
(`test_export_with_force_again_never_overwrites_a_kept_file`); `--out -` is refused
rather than written as a file named `-` (leave `--out` out to print;
`test_out_dash_is_refused_not_written_as_a_file`); the file appears complete or not
at all (temporary file, fsync, then a hard link that fails if the name appeared
meanwhile, or `os.replace` with `--force`). A missing directory is refused, never
created; a directory, a symbolic link (never written through, whatever it points to)
or another non-regular file (FIFO, device, socket), also as `FILE.previous`, is
refused with or without `--force`; a path inside the heuristics directory
(`$EVOLVE_HEURISTICS_DIR` or the package's own `heuristics/`) is refused, since
`evolved.py` and `evolved_trace.py` belong to write-back (its lock and `history/`)
and the rest is the package's code. `evolve tradeoff --png FILE` refuses a missing
directory, a directory, a link and a non-regular file the same way, before the
sweep, naming `--png` and the path (a directory used to be reported by the name of a
temporary file). Tests:
`test_export_refuses_an_existing_file_without_force_and_keeps_it_with_force`,
`test_export_refuses_a_missing_directory_without_creating_it`,
`test_export_never_writes_a_symlink_or_a_special_file[plain|force]`,
`test_export_with_force_refuses_a_previous_that_is_not_a_file`,
`test_export_refuses_the_heuristics_directory`,
`test_write_new_never_replaces_a_file_that_appeared_after_the_check`,
`test_tradeoff_png_refuses_a_missing_directory_or_a_directory`.
"""

from __future__ import annotations

import inspect
import os
import tracemalloc
from pathlib import Path

import pytest

from evolve.freerun import paired
from evolve.freerun import simulate as S
from evolve.data.sources import ngram as NG
from evolve.rules import adapters
from tests import clikit, tracekit
from tests.clikit import invoke, isolated, one_line_error  # noqa: F401 (isolated: a fixture)

pytestmark = pytest.mark.usefixtures("isolated")

TREE = "pmin(1.0, pdiv(target_prob, draft_prob))"
GIB = 1 << 30


tiny_dir = tracekit.tiny_dir_fixture()


class WorkStarted(AssertionError):
    """Raised by the stand-ins below: the command started work it should have refused."""


def _no_work(*args, **kwargs):
    raise WorkStarted("work started before the options were refused")


def _forbid_work(monkeypatch):
    """Rebuilding the pair, drawing prompts and decoding fail the test."""
    from evolve.data import decode as DEC
    monkeypatch.setattr(NG, "build_pair", _no_work)
    monkeypatch.setattr(NG, "prompt_starts", _no_work)
    monkeypatch.setattr(DEC, "decode", _no_work)


@pytest.fixture
def no_work(monkeypatch):
    _forbid_work(monkeypatch)


def _fake_run(parent: Path, name: str, tree: str = TREE) -> Path:
    return clikit.fake_trace_run(parent, name, tree)


# ------------------------------------------------------------------------------------
# simulate and --compare: sizes that cannot fit
# ------------------------------------------------------------------------------------

COMPARE = ("--compare", "standard_rejection", "--compare", "leniency:0.8")
SIMULATE = ("--heuristic", "standard_rejection")


@pytest.mark.parametrize("rules", [SIMULATE, COMPARE], ids=["simulate", "compare"])
@pytest.mark.parametrize("option, value", [
    ("--prompts", 10 ** 9), ("--blocks", 10 ** 9), ("--reps", 10 ** 12),
    ("--contexts", 10 ** 9), ("--prompts", S.MAX_PROMPTS + 1), ("--blocks", S.MAX_BLOCKS + 1),
    ("--reps", S.MAX_REPS + 1)])
def test_absurd_simulation_sizes_are_one_line_before_any_work(tiny_dir, no_work, rules,
                                                               option, value):
    r = invoke("simulate", *rules, "--data", tiny_dir, option, value)
    line = one_line_error(r, option, str(value), "at most")
    assert "MemoryError" not in r.output, line


def test_simulation_beyond_this_machines_memory_is_refused_naming_the_options(
        tiny_dir, no_work, monkeypatch):
    # within every per-option bound, but the whole cannot fit: 10^10 blocks' uniforms
    r = invoke("simulate", *SIMULATE, "--data", tiny_dir, "--prompts", S.MAX_PROMPTS,
               "--blocks", S.MAX_BLOCKS)
    one_line_error(r, f"--prompts {S.MAX_PROMPTS}", f"--blocks {S.MAX_BLOCKS}", "GiB of memory")
    # and against a small machine, sizes that a big one would take
    monkeypatch.setattr(S, "memory_limit", lambda: 2 * GIB)
    r = invoke("simulate", *SIMULATE, "--data", tiny_dir, "--reps", S.MAX_REPS)
    one_line_error(r, f"--reps {S.MAX_REPS}", "--contexts", "2.0 GiB")
    r = invoke("simulate", *SIMULATE, "--data", tiny_dir, "--prompts", 100_000,
               "--blocks", 1000)
    one_line_error(r, "--prompts 100000", "--blocks 1000", "2.0 GiB")


def test_comparison_beyond_its_rows_or_memory_is_refused(tiny_dir, no_work, monkeypatch):
    # 100,000 x 1,000 x g=4 drafted positions: beyond the 20,000,000 of a trace split
    r = invoke("simulate", *COMPARE, "--data", tiny_dir, "--prompts", 100_000,
               "--blocks", 1000)
    one_line_error(r, "--prompts 100000", "--blocks 1000", "drafted positions", "20,000,000")
    monkeypatch.setattr(S, "memory_limit", lambda: 2 * GIB)
    r = invoke("simulate", *COMPARE, "--data", tiny_dir, "--prompts", 100_000,
               "--blocks", 10)
    one_line_error(r, "--prompts 100000", "--blocks 10", "GiB of memory")


def test_library_refuses_sizes_before_any_work(monkeypatch):
    pair = tracekit.pair()
    ts = tracekit.split("test")
    rule = adapters.named_rule("standard_rejection")[0]
    _forbid_work(monkeypatch)
    with pytest.raises(S.SizeError, match="prompts"):
        paired.compare(pair, {"a": rule, "b": rule}, prompts=10 ** 9, blocks=4)
    with pytest.raises(S.SizeError, match="blocks"):
        paired.compare(pair, {"a": rule, "b": rule}, prompts=16, blocks=10 ** 9)
    with pytest.raises(S.SizeError, match="reps"):
        S.check_rule(pair, ts, rule, prompts=16, blocks=2, reps=10 ** 12)
    with pytest.raises(S.SizeError, match="memory"):
        S.check_rule(pair, ts, rule, prompts=S.MAX_PROMPTS, blocks=S.MAX_BLOCKS)


def test_memory_estimates_grow_with_every_option():
    base = S.simulation_bytes(16, 8, 200, 2000, 4, 64)
    for i in range(4):
        args = [16, 8, 200, 2000]
        args[i] *= 10
        assert S.simulation_bytes(*args, 4, 64) > base
    base = paired.comparison_bytes(16, 8, 2, 4, 16, 4, 64)
    for i in range(3):
        args = [16, 8, 2]
        args[i] *= 10
        assert paired.comparison_bytes(*args, 4, 16, 4, 64) > base
    # the default sizes are far below any machine's memory
    assert S.simulation_bytes(256, 16, 200, 2000, 4, 64) < GIB
    assert paired.comparison_bytes(256, 16, 2, 4, 16, 4, 64) < GIB
    from evolve.data import decode as DEC
    assert inspect.signature(DEC.decode).parameters["batch"].default == S.DECODE_BATCH


def _peak(fn) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_memory_estimates_are_upper_bounds_of_what_is_allocated():
    """Measured (numpy reports its buffers to tracemalloc) on sizes where the terms
    that grow with the options dominate: decoding uniforms and text, and the
    output sample's per-context draws over the vocabulary."""
    pair = tracekit.pair()
    ts = tracekit.split("test")
    rule = adapters.named_rule("leniency", 0.7)[0]
    g, L0 = pair.config.block_size, pair.config.prompt_len
    prompts, blocks = 100, 40
    got = _peak(lambda: S.decode_free(pair, rule, "test", prompts, blocks))
    assert got <= S.decoding_bytes(prompts, blocks, g, L0), got
    rows = S.trace_rows(ts, 4)
    ctx, pos, bpos = (ts.columns[f][rows] for f in ("context", "position", "block_position"))
    reps = 10_000
    got = _peak(lambda: S.output_sample(pair, ctx, pos, bpos, rule, reps=reps))
    estimate = S.simulation_bytes(0, 0, rows.size, reps, g, L0) - S.BASE_BYTES
    assert reps * S.VOCAB * 8 < got <= estimate, (got, estimate)


# ------------------------------------------------------------------------------------
# --compare: rules and parameters
# ------------------------------------------------------------------------------------

@pytest.mark.parametrize("spec, needles", [
    ("leniency:", ("'leniency:'", "empty")),
    ("leniency: ", ("'leniency: '", "empty")),
    ("ears:", ("'ears:'", "empty")),
    ("run:", ("'run:'", "empty")),
    ("nope", ("'nope'", "unknown rule")),
    ("standard_rejection:0.5", ("'standard_rejection:0.5'", "no parameter")),
    ("leniency:0", ("'leniency:0'", "0 < l <= 1")),
    ("leniency:nan", ("'leniency:nan'", "finite")),
    ("ears:-1", ("'ears:-1'", "beta >= 0")),
    ("ears:-1e308", ("'ears:-1e308'", "beta >= 0")),
    ("cactus:-1", ("'cactus:-1'", "delta >= 0")),
    ("hf_ensemble:1.5", ("'hf_ensemble:1.5'", "0 <= w <= 1")),
])
def test_compare_rule_errors_name_compare(tiny_dir, no_work, tmp_path, spec, needles):
    r = invoke("simulate", "--compare", "standard_rejection", "--compare", spec,
               "--data", tiny_dir, "--runs-dir", tmp_path)
    line = one_line_error(r, "--compare: ", *needles)
    assert "--rule" not in line and "--heuristic" not in line and "--param" not in line, line


@pytest.mark.parametrize("spec, needle", [
    ("run:" + "a" * 5000, "File name too long"),
    ("run:" + "a" * 200, "no such run directory"),
    ("leniency:" + "1" * 5000, "finite"),
    ("leniency:" + "z" * 5000, "not a number"),
    ("x" * 5000, "unknown rule"),
])
def test_a_long_compare_value_is_echoed_shortened(tiny_dir, no_work, tmp_path, spec, needle):
    """A --compare value of thousands of characters made a line as long: the value is
    echoed shortened, and the reason stays on the line."""
    r = invoke("simulate", "--compare", "standard_rejection", "--compare", spec,
               "--data", tiny_dir, "--runs-dir", tmp_path)
    line = one_line_error(r, "--compare: ", needle)
    assert len(line) < 600, len(line)


def test_named_rule_errors_name_the_rule_not_an_option():
    with pytest.raises(adapters.UnknownRule) as e:
        adapters.named_rule("nope")
    assert isinstance(e.value, KeyError) and e.value.field == "name"
    assert str(e.value).startswith("unknown rule 'nope'") and "--" not in str(e.value)
    for name, param, needle in (("standard_rejection", 0.5, "no parameter"),
                                ("leniency", 0.0, "0 < l <= 1"), ("ears", float("inf"), "finite")):
        with pytest.raises(adapters.RuleError) as e:
            adapters.named_rule(name, param)
        assert isinstance(e.value, ValueError) and e.value.field == "param"
        assert needle in str(e.value) and "--" not in str(e.value), str(e.value)


# ------------------------------------------------------------------------------------
# export --out
# ------------------------------------------------------------------------------------

def _export(runs: Path, *args):
    return invoke("export", "ok", "--format", "numpy", "--runs-dir", runs, *args)


@pytest.fixture
def runs(tmp_path):
    _fake_run(tmp_path / "runs", "ok")
    return tmp_path / "runs"


def test_export_refuses_an_existing_file_without_force_and_keeps_it_with_force(tmp_path, runs):
    out = tmp_path / "rule.py"
    out.write_text("mine\n")
    one_line_error(_export(runs, "--out", out), "--out", str(out), "--force")
    assert out.read_text() == "mine\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rule.py", "runs"]
    r = _export(runs, "--out", out, "--force")
    assert r.exit_code == 0, r.output
    assert "def threshold(" in out.read_text()
    assert (tmp_path / "rule.py.previous").read_text() == "mine\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rule.py", "rule.py.previous", "runs"]
    one_line_error(_export(runs, "--force"), "--force", "--out")


def test_export_with_force_again_never_overwrites_a_kept_file(tmp_path, runs):
    """A second --force used to overwrite FILE.previous, losing the user's original:
    every replaced file is kept, FILE.previous then FILE.previous.1, ..."""
    out = tmp_path / "rule.py"
    out.write_text("mine\n")
    for _ in range(3):
        r = _export(runs, "--out", out, "--force")
        assert r.exit_code == 0, r.output
    exported = out.read_text()
    assert (tmp_path / "rule.py.previous").read_text() == "mine\n"
    assert (tmp_path / "rule.py.previous.1").read_text() == exported
    assert (tmp_path / "rule.py.previous.2").read_text() == exported
    assert "kept as " in r.stderr and "rule.py.previous.2" in r.stderr, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "rule.py", "rule.py.previous", "rule.py.previous.1", "rule.py.previous.2", "runs"]


def test_out_dash_is_refused_not_written_as_a_file(tmp_path, runs, monkeypatch):
    """``--out -`` wrote a file named '-'; it is refused (leave --out out to print)."""
    monkeypatch.chdir(tmp_path)
    for force in ((), ("--force",)):
        one_line_error(_export(runs, "--out", "-", *force), "--out", "'-'", "standard output")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]
    r = _export(runs, "--out", "./-")                  # a file named '-', said so
    assert r.exit_code == 0 and (tmp_path / "-").is_file(), r.output


def test_export_refuses_a_missing_directory_without_creating_it(tmp_path, runs):
    out = tmp_path / "new" / "deeper" / "rule.py"
    one_line_error(_export(runs, "--out", out), "--out", str(out), "does not exist")
    assert not (tmp_path / "new").exists()
    (tmp_path / "file").write_text("x")
    one_line_error(_export(runs, "--out", tmp_path / "file" / "rule.py"), "--out",
                   "not a directory")
    one_line_error(_export(runs, "--out", ""), "--out", "empty")


@pytest.mark.parametrize("force", [(), ("--force",)], ids=["plain", "force"])
def test_export_never_writes_a_symlink_or_a_special_file(tmp_path, runs, force):
    target = tmp_path / "target.py"
    target.write_text("theirs\n")
    link = tmp_path / "link.py"
    link.symlink_to(target)
    dev = tmp_path / "null.py"
    dev.symlink_to(os.devnull)
    fifo = tmp_path / "fifo.py"
    os.mkfifo(fifo)
    (tmp_path / "dir.py").mkdir()
    for path, kind in ((link, "symbolic link"), (dev, "symbolic link"), (fifo, "FIFO"),
                       (tmp_path / "dir.py", "directory")):
        one_line_error(_export(runs, "--out", path, *force), "--out", str(path), kind)
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert dev.is_symlink() and fifo.is_fifo() and target.read_text() == "theirs\n"
    assert not list(tmp_path.glob("*.previous"))


def test_export_with_force_refuses_a_previous_that_is_not_a_file(tmp_path, runs):
    out = tmp_path / "rule.py"
    out.write_text("mine\n")
    (tmp_path / "rule.py.previous").mkdir()
    one_line_error(_export(runs, "--out", out, "--force"), "--out", "rule.py.previous",
                   "directory")
    assert out.read_text() == "mine\n"


def test_export_refuses_the_heuristics_directory(tmp_path, runs, monkeypatch):
    heur = tmp_path / "heuristics"
    heur.mkdir()
    installed = heur / "evolved.py"
    installed.write_text("# installed by write-back\n")
    monkeypatch.setenv("EVOLVE_HEURISTICS_DIR", str(heur))
    for path in (installed, heur / "evolved_trace.py", heur / "other.py"):
        for force in ((), ("--force",)):
            one_line_error(_export(runs, "--out", path, *force), "--out", str(path),
                           "heuristics directory")
    monkeypatch.chdir(heur)              # a relative path resolves into it too
    one_line_error(_export(runs, "--out", "evolved.py", "--force"), "heuristics directory")
    assert installed.read_text() == "# installed by write-back\n"
    assert sorted(p.name for p in heur.iterdir()) == ["evolved.py"]     # no history, no copy
    import heuristics                      # the package's own, whatever the environment
    own = Path(heuristics.__file__).parent / "evolved.py"
    before = own.read_bytes()
    one_line_error(_export(runs, "--out", own, "--force"), "--out", "heuristics directory")
    assert own.read_bytes() == before


def test_write_new_never_replaces_a_file_that_appeared_after_the_check(tmp_path):
    from evolve.export.outfile import OutputError, check_target, write_new
    out = check_target("--out", tmp_path / "rule.py", force=False)
    out.write_text("appeared meanwhile\n")
    with pytest.raises(OutputError, match="exists"):
        write_new("--out", out, b"new\n", force=False)
    assert out.read_text() == "appeared meanwhile\n"
    assert [p.name for p in tmp_path.iterdir()] == ["rule.py"]        # no temporary left
    write_new("--out", tmp_path / "fresh.py", b"new\n", force=False)
    assert (tmp_path / "fresh.py").read_text() == "new\n"


# ------------------------------------------------------------------------------------
# tradeoff --png
# ------------------------------------------------------------------------------------

@pytest.fixture
def no_sweep(monkeypatch):
    from evolve.rules import tuning
    monkeypatch.setattr(tuning, "tradeoff", _no_work)


def test_tradeoff_png_refuses_a_missing_directory_or_a_directory(tiny_dir, tmp_path, no_sweep):
    png = tmp_path / "new" / "t.png"
    one_line_error(invoke("tradeoff", "--data", tiny_dir, "--png", png), "--png", str(png),
                   "does not exist")
    assert not (tmp_path / "new").exists()
    d = tmp_path / "pictures"
    d.mkdir()
    line = one_line_error(invoke("tradeoff", "--data", tiny_dir, "--png", d), "--png", str(d),
                          "directory")
    assert ".tmp" not in line
    assert list(d.iterdir()) == []
    fifo = tmp_path / "fifo.png"
    os.mkfifo(fifo)
    one_line_error(invoke("tradeoff", "--data", tiny_dir, "--png", fifo), "--png", "FIFO")
    one_line_error(invoke("tradeoff", "--data", tiny_dir, "--png", ""), "--png", "empty")
