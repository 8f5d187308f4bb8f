"""An objective's settings are declared once, by the objective (``evolve.objectives.settings``),
and everything else is made from that declaration: ``Config``'s fields, defaults and range
checks, the options of ``evolve run`` and their help, the keywords of ``evolve.run`` and its
docstring, what a champion records (``champion.json``, a module's ``METADATA`` and header)
and what the run-file schema checks.

``test_a_new_objective_with_a_budget_is_one_module_and_one_registry_line`` adds a toy
objective with a budget to a scratch copy of the package, as docs/internals.md ("Where to
add things", "An objective") says, touching nothing else, and finds it in all of them.
"""

from __future__ import annotations

import inspect
import json
import shutil
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import evolve
from evolve.objectives import ALL_OBJECTIVES, OBJECTIVES, SETTINGS
from evolve.search.config import Config

ROOT = Path(__file__).resolve().parents[1]

TOY_MODULE = '''"""A toy objective: the expected seed metric, with a budget it declares."""

from evolve.objectives.settings import Setting
from evolve.objectives.tokens import TokenObjective

TOY_BUDGET = Setting("toy_budget", 0.05, 0.0, 1.0, "--budget-toy", "toy errors per token allowed",
                     "toy errors per token in [0, 1]", meta="toy_budget")


class ToyObjective(TokenObjective):
    settings = (TOY_BUDGET,)


TOY = ToyObjective("toy", True, "the expected metric within --budget-toy (token splits)")
'''

# What the scratch copy checks, in a fresh interpreter that imports it.
CHECKS = '''
import inspect, json
from click.testing import CliRunner
import evolve
from evolve.cli import main
from evolve.cli.runs import run_cmd
from evolve.export.champions import META_KEYS
from evolve.lang import codegen, treeio
from evolve.objectives import OBJECTIVES
from evolve.objectives.settings import champion_settings
from evolve.runs import schema
from evolve.runs.finalise import champion_record, module_metadata
from evolve.search.config import Config, ConfigError

out = {}
cfg = Config(objective="toy", toy_budget=0.03)
cfg.validate()
out["default"] = Config().toy_budget
try:
    Config(objective="toy", toy_budget=2.0).validate()
except ConfigError as e:
    out["range"] = str(e)
option = next(p for p in run_cmd.params if p.name == "toy_budget")
out["option"] = [option.opts, option.help, option.stated]
out["objective_help"] = next(p for p in run_cmd.params if p.name == "objective").help
r = CliRunner().invoke(main, ["run", "--budget-toy", "2", "--no-writeback"])
out["cli"] = [r.exit_code, r.output.strip()]
out["keyword"] = inspect.signature(evolve.run).parameters["toy_budget"].default
out["doc"] = "toy_budget=0.05" in evolve.run.__doc__
nodes = treeio.parse("pmin(1.0, pdiv(target_prob, draft_prob))")
champ = champion_record("t", nodes, 0, "toy", {"valid": {}, "test": {}},
                        champion_settings(OBJECTIVES["toy"], cfg))
out["champion"] = champ["toy_budget"]
meta = module_metadata("r", 0, {**champ, "metrics": {}})
out["metadata"] = meta.get("toy_budget")
out["header"] = "toy_budget: 0.03" in codegen.provenance(nodes, meta, "t", "g")
out["export"] = "toy_budget" in META_KEYS
m = {k: 0.5 for k in schema.champion_metric_keys(champ)}
try:
    schema.check_champion({**champ, "metrics": {"valid": m, "test": m}, "toy_budget": "x"},
                          "champion.json")
except schema.SchemaError as e:
    out["schema"] = str(e)
print(json.dumps(out))
'''


def test_a_new_objective_with_a_budget_is_one_module_and_one_registry_line(tmp_path):
    copy = tmp_path / "tree"
    ignore = shutil.ignore_patterns("__pycache__", "*.nbi", "*.nbc")
    for part in ("evolve", "heuristics"):
        shutil.copytree(ROOT / part, copy / part, ignore=ignore)
    (copy / "evolve" / "objectives" / "toy.py").write_text(TOY_MODULE)
    init = copy / "evolve" / "objectives" / "__init__.py"
    text = init.read_text()
    registry = "TASK_SPEED, TASK_SEED)}"
    assert registry in text
    init.write_text(text.replace(registry, "TASK_SPEED, TASK_SEED, TOY)}").replace(
        "\nOBJECTIVES:", "\nfrom evolve.objectives.toy import TOY\nOBJECTIVES:", 1))
    done = subprocess.run([sys.executable, "-c", CHECKS], cwd=tmp_path, capture_output=True,
                          text=True, env={"PYTHONPATH": str(copy), "PATH": "/usr/bin:/bin",
                                          "NO_COLOR": "1", "COLUMNS": "200"})
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["default"] == 0.05
    assert out["range"] == "toy_budget: 2.0 is invalid; expected toy errors per token in [0, 1]"
    assert out["option"] == [["--budget-toy"], "Objective toy: toy errors per token allowed.",
                             "0.05"]
    assert "toy: the expected metric within --budget-toy" in out["objective_help"]
    assert out["cli"][0] == 2 and out["cli"][1] == \
        "error: --budget-toy: 2.0 is invalid; expected toy errors per token in [0, 1]"
    assert out["keyword"] == 0.05 and out["doc"]
    assert out["champion"] == out["metadata"] == 0.03 and out["header"] and out["export"]
    assert "toy_budget" in out["schema"] and "'x'" in out["schema"]


def test_config_has_a_field_for_every_setting_with_its_declared_default_and_range():
    names = [f.name for f in fields(Config)]
    for s in SETTINGS:
        assert names.count(s.name) == 1 and getattr(Config(), s.name) == s.default
        assert Config.kinds()[s.name] == type(s.default).__name__
        assert any(s in o.settings for o in ALL_OBJECTIVES)
    # the settings follow the objective, in the order first declared
    at = names.index("objective")
    assert names[at + 1:at + 1 + len(SETTINGS)] == [s.name for s in SETTINGS]


def test_evolve_run_names_every_search_option_with_its_default():
    """``inspect.signature(evolve.run)`` (and so ``help(evolve.run)``) names each field of
    ``Config`` with its default, and the docstring gives each its help."""
    params = inspect.signature(evolve.run).parameters
    options = {n: p for n, p in params.items()
               if n not in ("data_dir", "runs_dir", "name", "resume", "writeback", "force",
                            "progress", "on_generation", "engine", "cluster", "scheduler")}
    assert list(options) == [f.name for f in fields(Config)]
    assert all(p.kind is p.KEYWORD_ONLY and p.default == getattr(Config(), n)
               for n, p in options.items())
    doc = evolve.run.__doc__
    for f in fields(Config):
        assert f"``{f.name}={f.default!r}``: {Config.help_of(f.name, False)[:30]}" in doc


def test_the_command_line_offers_every_setting_and_lists_every_objective():
    from evolve.cli.runs import run_cmd
    by_name = {p.name: p for p in run_cmd.params}
    for s in SETTINGS:
        assert by_name[s.name].opts == [s.flag], s.name
        assert by_name[s.name].help.endswith(f"{s.help}.")
        assert f"[{by_name[s.name].stated}]" == s.stated_default()    # [default: ...]
    objective_help = by_name["objective"].help
    assert all(f"{o.name}: {o.help}" in objective_help for o in OBJECTIVES.values())


def test_a_champion_records_the_settings_its_objective_reads():
    from evolve.objectives.settings import champion_settings
    cfg = Config(objective="speed_kl", tv_p99_cap=0.5)
    assert champion_settings(OBJECTIVES["speed_kl"], cfg) == {
        "kl_budget": 0.01, "tv_budget": 0.02, "tv_p99_cap": 0.5}      # no cap: not recorded
    assert champion_settings(OBJECTIVES["pareto"], cfg) == {"tv_budget": 0.02}
    assert champion_settings(OBJECTIVES["expected"], cfg) == {}
    assert json.dumps(champion_settings(OBJECTIVES["task_speed"], cfg)) == \
        '{"critical_budget": 0.01, "select_problems": 64}'
