"""A run's configuration from a hostile caller: wrong types and absurd values, from
the Python API and the command line (docs/reliability.md, guarantee 1).

Every value is type- and range-checked once, by ``Config.validate`` (and
``RunOptions`` for the run's other arguments), before anything is made on disk;
the error names the parameter (the command line names its option). The bounds
are those of the run's own reader, so whatever a run accepts at the start,
``--resume``, ``inspect`` and ``export`` read back.

Budgets are tiny (population 40, one or two generations, the 30-sequence splits
of conftest); runs use a temporary --runs-dir and no write-back.

Guarantee 25 of docs/reliability.md, Configuration from any caller:

A run's configuration is checked in one place, `Config.validate`
(`evolve/search/config.py`), for the command line, the Python API and a run read
back alike, and the run's other arguments (`writeback`, `force`, `name`, `resume`,
`data_dir`, `runs_dir`, `progress`) by `RunOptions` and `evolve.run`; all of it
before anything is created on disk. Types come first: whole numbers must be `int`
(never `bool`, `float` or `str`), numbers finite (`NaN` and infinities refused),
flags `bool` (`writeback='False'` is an error, not a write-back), names `str`. Then
ranges: those the command line always had, `--seed` >= 0, and on resume only
`generations` may be given. The error is one line naming the parameter and echoing
the value (`tournament: 2.5 is invalid; expected a whole number`); the command line
names its option instead (`--tournament: ...`, `--budget-kl: ...`), exit code 2.
Tests (`tests/test_hostile_config.py`):
`test_api_wrong_type_or_value_names_the_parameter_and_makes_nothing` (31 cases:
`tournament=2.5`, `elitism=1.5`, `threads=1.5`, `batch_blocks=2.5`, `seed='abc'`,
`seed=True`, `generations=True`, `max_height=5.5`, `seed_baselines='no'`,
`writeback='False'`, NaN and infinite budgets, ...; each checks that no runs or run
directory is left), `test_api_runs_dir_of_a_wrong_type_makes_nothing`,
`test_api_resume_with_a_bad_argument_changes_nothing`,
`test_cli_wrong_type_names_the_option_and_makes_nothing`,
`test_cli_value_out_of_range_is_one_line_naming_the_option`. The other library entry
points check their arguments the same way: `evolve.load_run` of anything but a path
(`123`, `None`, bytes) and `evolve.rules.tuning.tradeoff` with budgets that are not
a list of finite numbers >= 0 (NaN, -1, inf, `'abc'`, a bare float), an `extra` that
is not names of parsed trees, or a `blocks_test` that is not the test split's raise
one `EvolveError` line naming the parameter
(`test_load_run_of_what_is_not_a_path_is_one_line`,
`test_tradeoff_refuses_bad_arguments_in_one_line`, in `tests/test_api.py`).

Guarantee 26 of docs/reliability.md, What a run accepts, its readers accept:

The start-time bounds come from the readers' own definitions: a whole number may
have at most `jsonio.MAX_INT_DIGITS` (40) digits, the limit of the JSON reader that
`--resume`, `inspect` and `export` read `config.json` and checkpoints with, so
`--seed` or `--generations` of 41 digits or more (and seeds of the starts, `seed +
starts - 1`) are refused at the start instead of making a run that cannot be read
back. The resume command a run prints is checked at the start against the schema
`summary.json` is read with (`schema.check_resume_command`: at most 4,096
characters; `--cluster` and `--scheduler` with their values are part of it), so a
`--runs-dir` whose quoted form is too long is refused before any work, and an
interrupted cluster run's summary reads back. Tests:
`test_boundary_value_accepted_at_start_is_accepted_by_the_reader` (the extreme
accepted values of every field, written as `config.json` and read back through
`RunDir.meta` and `Config.from_dict`; `test_every_field_has_boundary_values` keeps
the table complete), `test_any_config_accepted_at_start_is_accepted_by_the_reader`
(hypothesis: hostile values in up to four fields; whatever `validate` accepts reads
back equal, whatever it refuses is one line naming a parameter),
`test_a_value_beyond_the_readers_bound_is_refused_at_the_start`,
`test_cli_seed_at_the_bound_runs_and_its_readers_accept_it` (a 40-digit seed: the
run, `inspect`, `export` and `--resume` all succeed),
`test_every_resume_command_a_run_prints_is_accepted_by_the_reader`,
`test_runs_dir_too_long_for_the_resume_command_is_refused_at_the_start`.
"""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import evolve
from evolve.runs import runner, schema
from evolve.io import jsonio
from evolve.lang.features import ALL_INPUT_NAMES
from evolve.objectives import SETTINGS
from evolve.runs.rundir import RunDir, RunError
from evolve.search.config import MAX_INT, MAX_POPULATION, Config, ConfigError
from tests.clikit import invoke, isolated, one_line_error  # noqa: F401 (isolated: a fixture)

pytestmark = pytest.mark.usefixtures("isolated")

POP = 40
DIGITS = jsonio.MAX_INT_DIGITS          # the reader's limit, the one definition
BIG = 10 ** (DIGITS + 10)               # 51 digits: refused by the reader


def made(root) -> list:
    """Everything under ``root`` (a directory that must stay empty or absent)."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")) if root.exists() else []


def read_back(cfg: Config) -> Config:
    """The configuration as a run's readers get it: written as config.json is and
    parsed by the one JSON reader, then ``Config.from_dict``."""
    text = json.dumps({"config": cfg.to_dict()}, indent=2, allow_nan=False)
    return Config.from_dict(jsonio.loads(text, "config.json", "run config",
                                         error=RunError)["config"])


# ------------------------------------------------------------------------------------
# Whatever is accepted at the start is accepted by the reader
# ------------------------------------------------------------------------------------

# For every field: the extreme values the start accepts (with the other fields they
# need), each of which the reader must accept too.
BOUNDARIES = {
    "generations": [{"generations": 1}, {"generations": MAX_INT}],
    "population": [{"population": 2, "tournament": 2, "elitism": 1},
                   {"population": MAX_POPULATION}],
    "seed": [{"seed": 0}, {"seed": MAX_INT}, {"seed": MAX_INT - 999, "starts": 1000}],
    "objective": [{"objective": name} for name in ("expected", "speed", "speed_kl")]
    + [{"objective": "pareto", "population": 40}],
    "tournament": [{"tournament": 1}, {"tournament": POP, "population": POP}],
    "parsimony": [{"parsimony": 1}, {"parsimony": 1.0}, {"parsimony": 2.0}],
    "cx_prob": [{"cx_prob": 0, "mut_prob": 0}, {"cx_prob": 1.0, "mut_prob": 0.0},
                {"cx_prob": 5e-324}],
    "mut_prob": [{"mut_prob": 1, "cx_prob": 0}, {"mut_prob": 0.3, "cx_prob": 0.7}],
    "max_height": [{"max_height": 2, "init_max_height": 2}, {"max_height": 30}],
    "max_size": [{"max_size": 3}, {"max_size": 1000}],
    "init_min_height": [{"init_min_height": 1}, {"init_min_height": 30, "init_max_height": 30,
                                                 "max_height": 30}],
    "init_max_height": [{"init_max_height": 1}, {"init_max_height": 30, "max_height": 30}],
    "elitism": [{"elitism": 0}, {"elitism": POP - 1, "population": POP}],
    "hof_size": [{"hof_size": 1}, {"hof_size": 1000}],
    "seed_baselines": [{"seed_baselines": True}, {"seed_baselines": False}],
    "tv_budget": [{"tv_budget": 0}, {"tv_budget": -0.0}, {"tv_budget": 1.0}],
    "kl_budget": [{"kl_budget": 0.0}, {"kl_budget": 100}, {"kl_budget": 1e-300}],
    "critical_budget": [{"critical_budget": 0.0}, {"critical_budget": 100},
                        {"critical_budget": 1e-300, "objective": "task_speed"}],
    "select_problems": [{"select_problems": 0}, {"select_problems": 1_000_000}],
    "agreement_budget": [{"agreement_budget": 0.0}, {"agreement_budget": 1}],
    "tv_position_cap": [{"tv_position_cap": 0}, {"tv_position_cap": 1.0}],
    "tv_p99_cap": [{"tv_p99_cap": 0.0}, {"tv_p99_cap": 1}],
    "tv_first_cap": [{"tv_first_cap": 0.0}, {"tv_first_cap": 1}],
    "first_tokens": [{"first_tokens": 1}, {"first_tokens": 16}],
    "threads": [{"threads": 0}, {"threads": MAX_INT}],
    "starts": [{"starts": 1}, {"starts": 1000}],
    "checkpoint_every": [{"checkpoint_every": 1}, {"checkpoint_every": MAX_INT}],
    "batch_blocks": [{"batch_blocks": 0},
                     {"batch_blocks": MAX_INT, "objective": "speed", "seed": MAX_INT}],
    "trajectory": [{"trajectory": False}, {"trajectory": True, "objective": "speed"}],
    "ess_floor": [{"ess_floor": 0}, {"ess_floor": 1.0}],
    "lookahead": [{"lookahead": False}, {"lookahead": True, "objective": "speed"},
                  {"lookahead": True, "objective": "pareto", "population": 40}],
    "device": [{"device": "cpu"}, {"device": "cuda"}],
    "inputs": [{"inputs": ""}, {"inputs": "draft_prob"},
               {"inputs": ",".join(ALL_INPUT_NAMES), "objective": "speed", "lookahead": True}],
}

# Just beyond: refused at the start, and refused by the reader too (one bound).
BEYOND = {
    "generations": MAX_INT + 1, "seed": MAX_INT + 1, "threads": MAX_INT + 1,
    "checkpoint_every": MAX_INT + 1, "batch_blocks": MAX_INT + 1,
}


def test_every_field_has_boundary_values():
    assert set(BOUNDARIES) == set(Config.kinds())


@pytest.mark.parametrize("kw", [kw for cases in BOUNDARIES.values() for kw in cases],
                         ids=lambda kw: ",".join(f"{k}={str(v)[:12]}" for k, v in kw.items()))
def test_boundary_value_accepted_at_start_is_accepted_by_the_reader(tmp_path, kw):
    cfg = Config(**kw)
    cfg.validate()
    assert read_back(cfg) == cfg
    # and through a real run directory, as --resume, inspect and export open it
    run = RunDir.create(tmp_path, "r", cfg.to_dict(), {"dir": str(tmp_path)})
    assert Config.from_dict(RunDir.open(tmp_path, "r").meta()["config"]) == cfg
    run.unlock()


@pytest.mark.parametrize("field", sorted(BEYOND))
def test_a_value_beyond_the_readers_bound_is_refused_at_the_start(field):
    cfg = Config(**{field: BEYOND[field]},
                 **({"objective": "speed"} if field == "batch_blocks" else {}))
    with pytest.raises(ConfigError) as e:
        cfg.validate()
    assert str(e.value).startswith(f"{field}: ") and f"at most {DIGITS} digits" in str(e.value)
    with pytest.raises((RunError, ConfigError)):     # the reader's own refusal
        read_back(cfg)


def test_the_seeds_of_every_start_stay_within_the_readers_bound():
    with pytest.raises(ConfigError, match="^seed: .*seed..seed"):
        Config(seed=MAX_INT - 998, starts=1000).validate()


HOSTILE = st.one_of(
    st.integers(min_value=-3, max_value=1003),
    st.integers(min_value=MAX_INT - 3, max_value=MAX_INT + 3),
    st.integers(min_value=-BIG, max_value=BIG),
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(min_value=-0.5, max_value=2.5),
    st.booleans(), st.none(), st.text(max_size=8),
    st.sampled_from(["expected", "speed", "pareto", "1", "True"]),
    st.lists(st.integers(), max_size=2),
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(sorted(Config.kinds())), HOSTILE, min_size=1,
                       max_size=4))
def test_any_config_accepted_at_start_is_accepted_by_the_reader(changes):
    cfg = Config(**{"population": POP, **changes})
    try:
        cfg.validate()
    except ConfigError as e:
        assert e.param in changes or e.param in ("population", "tournament", "elitism",
                                                 "init_max_height", "mut_prob", "seed")
        assert str(e).startswith(f"{e.param}: ") and "\n" not in str(e)
        return
    assert read_back(cfg) == cfg


# ------------------------------------------------------------------------------------
# The Python API: wrong types name the parameter; nothing is made on disk
# ------------------------------------------------------------------------------------

NAN, INF = float("nan"), math.inf

API_CASES = [
    ("tournament", {"tournament": 2.5}),
    ("elitism", {"elitism": 1.5}),
    ("threads", {"threads": 1.5}),
    ("batch_blocks", {"batch_blocks": 2.5}),
    ("population", {"population": "40"}),
    ("generations", {"generations": "2"}),
    ("cx_prob", {"cx_prob": "0.5"}),
    ("objective", {"objective": 5}),
    ("objective", {"objective": ["speed"]}),
    ("starts", {"starts": "2"}),
    ("seed", {"seed": "abc"}),
    ("seed", {"seed": True}),
    ("seed", {"seed": 1.0}),
    ("seed", {"seed": -1}),
    ("seed", {"seed": BIG}),
    ("seed", {"seed": 10 ** 5000}),
    ("generations", {"generations": True}),
    ("generations", {"generations": 10 ** 44}),
    ("max_height", {"max_height": 5.5}),
    ("seed_baselines", {"seed_baselines": "no"}),
    ("seed_baselines", {"seed_baselines": 1}),
    ("tv_budget", {"tv_budget": NAN}),
    ("kl_budget", {"kl_budget": INF}),
    ("parsimony", {"parsimony": True}),
    ("parsimony", {"parsimony": "1.2"}),
    ("writeback", {"writeback": "False"}),
    ("writeback", {"writeback": 0}),
    ("force", {"force": "yes"}),
    ("name", {"name": 5}),
    ("data_dir", {"data_dir": 5}),
    ("progress", {"progress": "print"}),
]


@pytest.mark.parametrize("param,kw", API_CASES,
                         ids=[f"{p}-{i}" for i, (p, _) in enumerate(API_CASES)])
def test_api_wrong_type_or_value_names_the_parameter_and_makes_nothing(
        tmp_path, small_data_dir, param, kw):
    runs = tmp_path / "runs"
    args = {"data_dir": small_data_dir, "runs_dir": runs, "generations": 1, "population": POP,
            "writeback": False, "name": "r", **kw}
    with pytest.raises(ConfigError) as e:
        evolve.run(**args)
    line = str(e.value)
    assert line.startswith(f"{param}: ") and "\n" not in line, line
    assert e.value.param == param
    assert made(tmp_path) == []          # no runs directory, no run directory


def test_api_runs_dir_of_a_wrong_type_makes_nothing(tmp_path, small_data_dir, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="^runs_dir: "):
        evolve.run(data_dir=small_data_dir, runs_dir=5, generations=1, population=POP,
                   writeback=False)
    assert made(tmp_path) == []


@pytest.fixture(scope="module")
def api_run(tmp_path_factory, small_data_dir):
    parent = tmp_path_factory.mktemp("api_runs")
    res = evolve.run(data_dir=small_data_dir, runs_dir=parent, name="done", generations=1,
                     population=POP, seed=3, writeback=False)
    assert res.status == "finished"
    return res.path


def listing(root) -> dict:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


@pytest.mark.parametrize("param,kw", [
    ("generations", {"generations": True}),
    ("generations", {"generations": 2.0}),
    ("generations", {"generations": BIG}),
    ("seed", {"seed": 4}),                  # only generations may be given on resume
    ("writeback", {"writeback": "False"}),
])
def test_api_resume_with_a_bad_argument_changes_nothing(api_run, param, kw):
    before = listing(api_run)
    with pytest.raises(ConfigError) as e:
        evolve.run(runs_dir=api_run.parent, resume=api_run.name, **{"writeback": False, **kw})
    assert str(e.value).startswith(f"{param}: "), str(e.value)
    assert listing(api_run) == before


# ------------------------------------------------------------------------------------
# The command line: the same checks, naming the option; nothing is made on disk
# ------------------------------------------------------------------------------------

CLI_RANGE = [
    ("--seed", str(BIG)),                       # 51 digits: inspect would refuse the run
    ("--seed", "9" * (DIGITS + 1)),
    ("--generations", str(10 ** 44)),           # its resume command would be refused
    ("--seed", "-1"),
    ("--threads", "-1"),
    ("--threads", str(BIG)),
    ("--batch-blocks", str(BIG)),
    ("--budget-kl", "200"),
    ("--budget-tv", "nan"),
    ("--cap-tv-p99", "nan"),
    ("--cap-tv-position", "inf"),
    ("--init-max-height", "0"),
    ("--starts", "1001"),
]


@pytest.mark.parametrize("option,value", CLI_RANGE)
def test_cli_value_out_of_range_is_one_line_naming_the_option(tmp_path, small_data_dir,
                                                              option, value):
    line = one_line_error(invoke("run", "--population", POP, "--generations", 1,
                                 "--data", small_data_dir, "--runs-dir", tmp_path / "runs",
                                 "--name", "r", "--no-writeback", option, value))  # last wins
    assert line.startswith(f"error: {option}: ") and value in line, line
    assert made(tmp_path) == []


@pytest.mark.parametrize("option,value", [
    ("--tournament", "2.5"), ("--elitism", "1.5"), ("--threads", "1.5"),
    ("--batch-blocks", "2.5"), ("--seed", "abc"), ("--generations", "1e3"),
    ("--max-height", "5.5"), ("--population", "forty"), ("--cx-prob", "half"),
])
def test_cli_wrong_type_names_the_option_and_makes_nothing(tmp_path, small_data_dir,
                                                           option, value):
    r = invoke("run", option, value, "--data", small_data_dir, "--runs-dir", tmp_path / "runs",
               "--no-writeback")
    assert r.exit_code == 2 and "Traceback" not in r.output, (r.output, r.exception)
    assert option in r.stderr and value in r.stderr
    assert made(tmp_path) == []


@pytest.mark.parametrize("flag", [s.flag for s in SETTINGS if s.kind == "float"])
def test_cli_setting_that_is_not_a_number_is_one_line_naming_it(tmp_path, small_data_dir,
                                                                flag):
    """Every objective's setting, as declared (``evolve.objectives.SETTINGS``): a value
    that is not a number is one line naming the option, as one out of range is."""
    line = one_line_error(invoke("run", flag, "half", "--data", small_data_dir,
                                 "--runs-dir", tmp_path / "runs", "--no-writeback"))
    assert line == f"error: {flag}: 'half' is invalid; expected a number", line
    assert made(tmp_path) == []


def test_cli_seed_at_the_bound_runs_and_its_readers_accept_it(tmp_path, small_data_dir):
    """The largest seed the start accepts makes a run that inspect, export and
    --resume read back (a longer one used to run, then be refused by them)."""
    runs = tmp_path / "runs"
    seed = "9" * DIGITS
    r = invoke("run", "--seed", seed, "--population", POP, "--generations", 1, "--name", "big",
               "--data", small_data_dir, "--runs-dir", runs, "--no-writeback", "--json")
    assert r.exit_code == 0, r.output
    r = invoke("inspect", "big", "--runs-dir", runs, "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["config"]["seed"] == int(seed)
    r = invoke("export", "big", "--format", "numpy", "--runs-dir", runs,
               "--allow-infeasible")     # one generation: below standard rejection
    assert r.exit_code == 0, r.output
    r = invoke("run", "--resume", "big", "--generations", 2, "--runs-dir", runs,
               "--no-writeback", "--json")
    assert r.exit_code == 0, r.output


# ------------------------------------------------------------------------------------
# The resume command a run prints is one its reader accepts
# ------------------------------------------------------------------------------------

@pytest.mark.parametrize("writeback", [True, False])
@pytest.mark.parametrize("force", [True, False])
@pytest.mark.parametrize("cluster,scheduler", [(None, None), ("local:2", None),
                                               (None, "tcp://10.0.0.1:8786"),
                                               ("local:2", "tls://h:1")])
def test_every_resume_command_a_run_prints_is_accepted_by_the_reader(
        tmp_path, writeback, force, cluster, scheduler):
    opts = runner.RunOptions(config=Config(), data_dir=tmp_path, runs_parent=tmp_path / "a b'c",
                             writeback=writeback, force=force, cluster=cluster,
                             scheduler=scheduler)
    cmd = runner.resume_command(opts, "r")
    assert schema.check_resume_command(cmd, "summary.json", "r") == cmd
    summary = {"status": "interrupted", "generation": 1, "resume": cmd}
    assert schema.check_summary(summary, "summary.json", "r") == summary


def test_runs_dir_too_long_for_the_resume_command_is_refused_at_the_start(tmp_path,
                                                                           small_data_dir):
    deep = tmp_path / "parent"
    for _ in range(5):                 # 1,000 bytes on disk, 5,000 characters once quoted
        deep = deep / ("'" * 200)
    line = one_line_error(invoke("run", "--population", POP, "--generations", 1,
                                 "--data", small_data_dir, "--runs-dir", deep,
                                 "--no-writeback"))
    assert "--runs-dir" in line and str(schema.MAX_RESUME_CHARS) in line
    assert made(tmp_path) == []

