"""The defaults `evolve run --help` states are the configuration's own: the help text
spells them out (so that `--help` need not import numpy) and this test holds them to
``Config``'s defaults, as tests/test_cli_trace.py does for `evolve data trace`."""

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
