"""Tables keep their numbers and fit (``evolve.cli.render.Terminal``): piped to a file, a
table fits ``COLUMNS`` (120 when it is not set) with every short cell whole and no
padding at the ends of its lines; only a cut column (a formula, whole in ``--json``) is
shortened, with an ellipsis; on a terminal too narrow for it, cells wrap onto further
lines and no digit is dropped."""

import io
import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

from evolve.cli.render import Terminal
from tests import tracekit
from tests.clikit import fake_trace_run, invoke

ROOT = Path(__file__).resolve().parents[1]
tiny_dir = tracekit.tiny_dir_fixture()

COLUMNS = [("rule", "left"), ("param", "right"), ("tokens/call", "right"),
           ("TV/token", "right"), ("slot TV p99", "right"), ("KL/token", "right"),
           ("valid TV", "right"), ("of oracle", "right"), ("", "left")]
ROWS = [["knapsack_oracle", "", "2.3980 ± 0.0198", "0.0100", "0.3918", "0.0340", "-",
         "100%", "a bound, not a rule"],
        ["position_leniency", "0.84/0.98/1.00/1.00", "2.3776 ± 0.0191", "0.0094", "0.0796",
         "0.0013", "0.0099", "72%", ""],
        ["typical_acceptance", "eps=0.01213", "-", "-", "-", "-", "-", "-",
         "no parameter fits on valid"]]
TITLE = "TV budget 0.01 per token: tuned on valid (4,096 blocks), reported on test"


class _Stream(io.StringIO):
    def __init__(self, tty: bool):
        super().__init__()
        self._tty = tty

    def isatty(self):
        return self._tty


def _print_table(monkeypatch, tty: bool, columns: int) -> str:
    out = _Stream(tty)
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setenv("COLUMNS", str(columns))
    Terminal().table(TITLE, COLUMNS, ROWS)
    return _plain(out)


def _plain(out: io.StringIO) -> str:
    """What was printed, without the terminal's styles (bold headers on a terminal)."""
    return re.sub(r"\x1b\[[0-9;]*m", "", out.getvalue())


def _digits(text: str) -> Counter:
    return Counter(ch for ch in text if ch.isdigit())


def test_a_piped_table_fits_120_columns_with_its_short_cells_whole(monkeypatch):
    """Not a terminal, COLUMNS unset: the table (135 columns at its natural width) fits
    120, every cell of up to 20 characters but the notes' (the last column, which wraps
    first) appears whole on its row, no line ends in a space, and every digit is kept."""
    monkeypatch.delenv("COLUMNS", raising=False)
    out = _Stream(False)
    monkeypatch.setattr(sys, "stdout", out)
    Terminal().table(TITLE, COLUMNS, ROWS)
    text = _plain(out)
    lines = text.splitlines()
    assert max(map(len, lines)) <= 120 and "…" not in text
    assert all(ln == ln.rstrip() for ln in lines), [ln for ln in lines if ln != ln.rstrip()]
    for row in ROWS:
        line = next(ln for ln in lines if ln.startswith(row[0] + " "))
        for cell in row[:-1]:
            if len(cell) <= 20:
                assert cell in line, (cell, line)
    want = _digits(TITLE + "".join(h for h, _ in COLUMNS) + "".join(map("".join, ROWS)))
    assert _digits(text) == want


def test_a_piped_table_fits_the_columns_it_is_given(monkeypatch):
    """COLUMNS set (80): the table fits it, every digit kept."""
    text = _print_table(monkeypatch, tty=False, columns=80)
    assert max(map(len, text.splitlines())) <= 80
    assert _digits(text) == _digits(TITLE + "".join(h for h, _ in COLUMNS)
                                    + "".join(map("".join, ROWS)))


def test_a_cut_column_ends_in_an_ellipsis_and_the_rest_stay_whole(monkeypatch):
    """A formula too long for the room left is cut with an ellipsis (the column is
    declared "cut": its text is whole in --json); the other cells are whole."""
    monkeypatch.delenv("COLUMNS", raising=False)
    out = _Stream(False)
    monkeypatch.setattr(sys, "stdout", out)
    long = "min(1, " + "(t / d) * " * 30 + "1)"
    Terminal().table("runs", [("run", "left"), ("valid", "right"),
                              ("champion", "left", "cut")],
                     [["a-run", "2.3360", long], ["b-run", "2.4184", "t / d"]])
    lines = _plain(out).splitlines()
    assert max(map(len, lines)) <= 120
    row = next(ln for ln in lines if ln.startswith("a-run "))
    assert row.endswith("…") and "2.3360" in row and len(lines) == 5, lines
    assert next(ln for ln in lines if ln.startswith("b-run ")).endswith("t / d")


def test_a_narrow_terminal_wraps_cells_and_keeps_every_digit(monkeypatch):
    """A terminal of 60 columns: the table fits it, and every digit of the title, the
    headers and the cells is still there (wrapped, not cut)."""
    text = _print_table(monkeypatch, tty=True, columns=60)
    assert "…" not in text
    assert max(len(ln) for ln in text.splitlines()) <= 60
    want = _digits(TITLE + "".join(h for h, _ in COLUMNS) + "".join(map("".join, ROWS)))
    assert _digits(text) == want


def test_tradeoff_piped_holds_every_number_of_its_json(tiny_dir):
    """`evolve tradeoff` into a file (COLUMNS 120): no line over 120 characters, and each
    row's tokens per call with its standard error, its TV and KL, whole on the row's
    first line, as --json has them; each reason a row has no numbers is there."""
    doc = json.loads(invoke("tradeoff", "--data", tiny_dir, "--budget", 0.01, "--budget",
                            0.03, "--json").stdout)
    text = invoke("tradeoff", "--data", tiny_dir, "--budget", 0.01, "--budget", 0.03,
                  env={"COLUMNS": "120"}).stdout
    assert "…" not in text
    table = text.split("engine settings")[0]
    assert max(map(len, table.splitlines())) <= 120
    seen = 0
    for entry in doc["budgets"]:
        part = text.split(f"TV budget {entry['budget']:g} per token")[1]
        for r in entry["rows"]:
            line = next(ln for ln in part.splitlines()
                        if re.match(rf"{re.escape(r['rule'])}\s", ln))
            if r["test"] is None:
                continue
            t = r["test"]
            for cell in (f"{t['tokens_per_call']:.4f} ± {t['tokens_se']:.4f}",
                         f"{t['tv_per_token']:.4f}", f"{t['kl_per_token']:.4f}"):
                assert cell in line, (cell, line)
            seen += 1
    assert seen >= 6
    flat = " ".join(text.split())
    assert "no parameter fits on valid" in " ".join(
        ln.split("│")[-1].strip() for ln in text.splitlines() if "│" in ln) or all(
        r["test"] is not None for e in doc["budgets"] for r in e["rows"]), flat


def test_a_table_redirected_to_a_file_by_the_shell(tmp_path):
    """The real thing: `evolve runs > file` in a shell (COLUMNS unset), a long run name
    and a long champion: no line over 120 characters or ending in a space, the name
    whole, the champion cut with an ellipsis (`evolve runs --json` has it whole)."""
    runs = tmp_path / "runs"
    name = "a-run-whose-name-is-long-" + "0123456789" * 3
    tree = "pmin(1.0, pdiv(target_prob, mul(0.987654321, draft_prob)))"
    for _ in range(12):
        tree = f"add({tree}, mul(0.123456789, draft_entropy))"
    fake_trace_run(runs, name, tree)
    out = tmp_path / "out.txt"
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "NO_COLOR": "1"}
    subprocess.run(f"'{sys.executable}' -m evolve runs --runs-dir '{runs}' > '{out}'",
                   shell=True, check=True, env=env, cwd=tmp_path, timeout=120)
    lines = out.read_text().splitlines()
    assert max(map(len, lines)) <= 120 and all(ln == ln.rstrip() for ln in lines), lines
    row = next(ln for ln in lines if ln.startswith(name + " "))
    assert row.endswith("…"), row
    doc = invoke("runs", "--runs-dir", runs, "--json").stdout
    assert "0.123457 * de" in doc and "…" not in doc


def _record(g: int) -> dict:
    return {"generation": g, "best_train": 0.5, "median_train": 0.4, "best_valid": 0.5,
            "mean_size": 7.0, "timing": {"evals_per_s": 1000.0}}


def test_the_first_eta_does_not_count_compilation(monkeypatch):
    """Generation 0 took 100 s (the kernels compiling), each later one 3 s: the ETA at
    generation 1 of 20 is 19 x 3 s, not 100 s a generation (the run's first estimate
    said 'eta 255s' for a run of 20 s)."""
    from evolve.api import progress
    clock = iter([100.0, 103.0, 106.0])
    monkeypatch.setattr(progress.time, "perf_counter", lambda: next(clock))
    monkeypatch.setattr(sys, "stdout", _Stream(False))
    notes = []
    term = Terminal()
    monkeypatch.setattr(term, "note", notes.append)
    with term.progress(20) as bar:
        for g in range(3):
            bar.update(_record(g))
    assert notes[0].endswith("eta after the next generation"), notes
    assert notes[1].endswith("eta 57s"), notes          # 19 generations x 3 s
    assert notes[2].endswith("eta 54s"), notes


def test_a_line_meter_speaks_at_least_every_ten_seconds():
    """A long step counted by a LineMeter: a line whenever 10 s have passed since the
    last, naming what is under way, none in between."""
    from evolve.api.progress import LineMeter
    now = [0.0]
    said = []
    m = LineMeter(said.append, "tradeoff", 4, "steps", clock=lambda: now[0])
    for t, what in ((3.0, "sweeping a"), (11.0, "sweeping b"), (12.0, "tuning a"),
                    (25.0, "tuning b")):
        now[0] = t
        m.advance(1, what)
    assert said == ["tradeoff: 2/4 steps (sweeping b), 0.18 steps/s, 11 s, eta 11 s",
                    "tradeoff: 4/4 steps (tuning b), 0.16 steps/s, 25 s, eta 0 s"]


def test_the_starts_table_keeps_each_champion_whole(monkeypatch):
    """``evolve run --starts`` (``views.show_starts``): a champion's formula, however
    long, is printed whole, wrapped within the 80 columns, constants included."""
    from evolve.cli import views
    long = "pmin(1.0, pdiv(target_prob, mul(draft_prob, " + "add(0.123456789, " * 8 + \
        "draft_entropy" + ")" * 10
    ch = {"task": "tokens", "chosen_seed": 2, "starts": [
        {"seed": 1, "valid_score": 0.5, "valid": {}, "test": {}, "expression": long},
        {"seed": 2, "valid_score": 0.6, "valid": {}, "test": {}, "expression": "draft_prob"}]}
    out = _Stream(False)
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setenv("COLUMNS", "80")
    views.show_starts(ch, Terminal())
    text = _plain(out)
    assert "…" not in text and max(map(len, text.splitlines())) <= 80
    column = "".join(ln.split("│")[-1].strip() for ln in text.splitlines()
                     if "│" in ln and not ln.lstrip().startswith("2 "))
    assert column.replace(" ", "") == long.replace(" ", ""), column
