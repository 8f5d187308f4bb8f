"""The defaults `evolve run --help` states are the configuration's own: the help text is
made from ``Config``'s declarations (and the objectives' settings from theirs), each option
states its default as text (``evolve.cli.common.Stated``, so that `--help` need not import
numpy), and this test holds what it states to ``Config``'s defaults, as
tests/test_cli_trace.py does for `evolve data trace`. Every command shows its defaults in
one format, click's ``[default: X]``."""

import re
from dataclasses import fields

import click
from click.testing import CliRunner

from evolve.cli import main
from evolve.cli.common import Stated
from evolve.cli.runs import run_cmd
from evolve.search.config import Config


def _stated_defaults(command) -> dict:
    return {p.name: p.stated for p in command.params
            if isinstance(p, Stated) and p.stated is not None}


def _commands(group, path=()):
    for name, cmd in group.commands.items():
        if isinstance(cmd, click.Group):
            yield from _commands(cmd, path + (name,))
        else:
            yield path + (name,)


def test_every_command_shows_its_defaults_one_way():
    """No option's help states a default in brackets of its own ("[0.7]", "[default: 4]"
    written by hand): every default shown is click's "[default: X]"; and `evolve --help`
    cuts no command's summary with "..."."""
    seen = 0
    for path in _commands(main):
        cmd = main
        for name in path:
            cmd = cmd.commands[name]
        for p in cmd.params:
            assert not re.search(r"\[[^\]]*\]\.?\s*$", getattr(p, "help", None) or ""), \
                (path, p.name, p.help)
        out = CliRunner().invoke(main, [*path, "--help"], env={"COLUMNS": "400"}).output
        seen += out.count("[default: ")
    assert seen >= 20
    for group in ([], ["data"]):
        out = CliRunner().invoke(main, [*group, "--help"], env={"COLUMNS": "80"}).output
        assert "..." not in out.split("Commands:")[1], out


def test_run_help_states_the_configurations_defaults():
    defaults = {f.name: getattr(Config(), f.name) for f in fields(Config)}
    stated = _stated_defaults(run_cmd)
    assert {"generations", "population", "seed", "tournament", "cx_prob", "mut_prob",
            "max_height", "max_size", "elitism"} <= set(stated), stated
    for name, text in stated.items():
        text = text.split(",")[0].strip()          # "[1, no cap]": the value, then a gloss
        assert name in defaults, f"--help states a default for {name}, not a Config field"
        assert text == str(defaults[name]) or text == f"{defaults[name]:g}", \
            (name, text, defaults[name])


def test_the_command_line_loads_no_kernel_or_optional_library():
    """`import evolve.cli` (what `evolve --help` and every command start with) loads
    neither Numba nor torch, DEAP, sympy or matplotlib: a command loads what it runs. It
    does load the objectives (``evolve.objectives``, numpy only): `evolve run` lists them
    and makes its options from the settings they declare."""
    import subprocess
    import sys
    heavy = ("numba", "torch", "deap", "sympy", "matplotlib", "distributed", "transformers")
    code = ("import sys, evolve.cli; assert 'evolve.objectives' in sys.modules; "
            f"print(sorted(m for m in {heavy!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]", out


def test_the_guide_tables_every_run_option_with_the_configurations_default():
    """docs/guide.md's tables of `evolve run` options: every option is a row, and each
    default the table states for a configuration field is Config's own."""
    from pathlib import Path
    text = (Path(__file__).resolve().parents[1] / "docs" / "guide.md").read_text()
    section = text.split("### `evolve run` options", 1)[1].split("\n### ", 1)[0]
    rows = [[c.strip() for c in r.strip().strip("|").split("|")]
            for r in section.splitlines() if r.startswith("| `--")]
    listed = set(re.findall(r"`(--[a-z0-9-]+)", " ".join(r[0] for r in rows)))
    assert {p.opts[0] for p in run_cmd.params} <= listed, \
        sorted({p.opts[0] for p in run_cmd.params} - listed)
    config = Config()
    checked = 0
    for r in rows:
        keywords = re.findall(r"`(\w+)`", r[1])
        defaults = [d.strip() for d in r[2].split(",")]
        if len(keywords) != len(defaults):
            continue
        for key, stated in zip(keywords, defaults):
            if not hasattr(config, key) or key in ("inputs",):
                continue
            value = getattr(config, key)
            first = stated.split()[0] if stated else ""
            if isinstance(value, bool):
                assert first == ("on" if value else "off"), (key, stated)
            elif isinstance(value, (int, float)):
                assert first in (str(value), f"{value:g}"), (key, stated, value)
            else:
                assert first == value, (key, stated, value)
            checked += 1
    assert checked >= 20, checked
