"""The defaults `evolve run --help` states are the configuration's own: the help text is
made from ``Config``'s declarations (and the objectives' settings from theirs) and this
test holds what it states to ``Config``'s defaults, as tests/test_cli_trace.py does for
`evolve data trace`."""

import re
from dataclasses import fields

from evolve.cli.runs import run_cmd
from evolve.search.config import Config

STATED = re.compile(r"\[(?:default: )?([^\]]+)\]\.?\s*$")


def _stated_defaults(command) -> dict:
    out = {}
    for p in command.params:
        m = STATED.search(p.help or "")
        if m:
            out[p.name] = m.group(1).strip()
    return out


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
