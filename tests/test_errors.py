"""One error base class: every error the library raises for bad input is an
``EvolveError``; the command line catches that class alone (a KeyError from a bug
stays a bug); library messages name parameters and the command line its options;
one definition of an error's first line."""

import importlib
import pkgutil
import re
from pathlib import Path

import pytest

import evolve
from evolve import errors
from evolve.errors import EvolveError, UnknownName, first_line
from tests.clikit import invoke, isolated, one_line_error  # noqa: F401 (fixture)

pytestmark = pytest.mark.usefixtures("isolated")

# Exception classes of the package that are not errors a user sees, each with why.
INTERNAL = {
    "evolve.io.lock.Busy": "the lock's control flow: every holder turns it into a "
                             "RunError or a command's one line naming the directory",
    "evolve.data.sources.hf.models._Unpickling": "the unpickler's refusal inside a model "
                                                 "load, turned into HFTraceError there",
    "evolve.cli.common._UsageLine": "click's own usage error, which click's main shows as "
                                    "one line and exit code 2 (a click.ClickException)",
}
# Packages a module may need that a minimal install lacks (the module is then skipped).
OPTIONAL = {"dask", "distributed", "torch", "transformers", "matplotlib", "sympy", "triton"}


def package_exceptions() -> dict:
    """Every exception class defined in a module of ``evolve``: qualified name -> class."""
    found = {}
    for info in pkgutil.walk_packages(evolve.__path__, "evolve."):
        if info.name.endswith("__main__"):
            continue
        try:
            module = importlib.import_module(info.name)
        except ModuleNotFoundError as e:
            if (e.name or "").split(".")[0] in OPTIONAL:
                continue
            raise
        for obj in vars(module).values():
            if (isinstance(obj, type) and issubclass(obj, BaseException)
                    and obj.__module__ == info.name):
                found[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return found


def test_every_error_class_of_the_package_is_an_evolve_error():
    found = package_exceptions()
    assert len(found) >= 15, sorted(found)          # the walk did find them
    stale = sorted(set(INTERNAL) - set(found))
    assert not stale, f"INTERNAL names classes that no longer exist: {stale}"
    outside = sorted(name for name, cls in found.items()
                     if name not in INTERNAL and not issubclass(cls, EvolveError))
    assert not outside, f"not EvolveError (derive from it, or list in INTERNAL): {outside}"
    for name in INTERNAL:
        assert not issubclass(found[name], EvolveError), name


def test_error_classes_keep_their_old_bases():
    """``except ValueError`` / ``RuntimeError`` / ``KeyError`` callers still catch them."""
    from evolve.cluster import ClusterError, ClusterInterrupted
    from evolve.rules.adapters import RuleError, UnknownRule
    from evolve.runs.rundir import RunError
    from evolve.search.config import ConfigError
    for cls in (ConfigError, RunError, RuleError, ClusterError, UnknownName):
        assert issubclass(cls, EvolveError) and issubclass(cls, ValueError), cls
    assert issubclass(ClusterError, RuntimeError) and issubclass(ClusterInterrupted, ClusterError)
    assert issubclass(UnknownRule, KeyError) and issubclass(UnknownName, KeyError)
    assert str(UnknownName("unknown thing 'x'")) == "unknown thing 'x'"    # not quoted


# ------------------------------------------------------------ the CLI handler

class NewKindOfError(EvolveError):
    """A subclass the command line has never heard of."""


def _benchmark_raises(monkeypatch, exc):
    from evolve.data import tokens

    def load_splits(*a, **k):
        raise exc
    monkeypatch.setattr(tokens, "load_splits", load_splits)


def test_the_cli_catches_any_subclass_of_the_base(monkeypatch, small_data_dir):
    """No hand-kept list: a new subclass raised deep inside a command is one line,
    exit code 2."""
    _benchmark_raises(monkeypatch, NewKindOfError("train.npz: row 3: something is off"))
    r = invoke("benchmark", "--data", small_data_dir)
    assert one_line_error(r) == "error: train.npz: row 3: something is off"


def test_the_cli_names_its_option_for_the_parameter(monkeypatch, small_data_dir):
    """An error about a parameter is printed with the command's option for it; one
    about a parameter the command has no option for keeps the parameter's name."""
    _benchmark_raises(monkeypatch, NewKindOfError.of("heuristics", "'x' is invalid"))
    r = invoke("benchmark", "--data", small_data_dir)
    assert one_line_error(r) == "error: --rule: 'x' is invalid"
    _benchmark_raises(monkeypatch, NewKindOfError.of("no_such_option", "'x' is invalid"))
    r = invoke("benchmark", "--data", small_data_dir)
    assert one_line_error(r) == "error: no_such_option: 'x' is invalid"


def test_a_key_error_from_a_bug_is_not_reported_as_bad_input(monkeypatch, small_data_dir):
    """A KeyError raised by a bug (here: deep inside the loading of the splits) is not
    turned into a one-line "bad input" with exit code 2: it shows as the bug it is."""
    _benchmark_raises(monkeypatch, KeyError("tokens_per_call"))
    r = invoke("benchmark", "--data", small_data_dir)
    assert r.exit_code != 2 and isinstance(r.exception, KeyError), (r.exit_code, r.output)
    assert "error: " not in r.stderr


def test_an_unknown_name_is_still_one_line(small_data_dir):
    """The intended lookup failure (an unknown --rule) stays bad input."""
    r = invoke("benchmark", "--data", small_data_dir, "--heuristic", "nope")
    line = one_line_error(r, "--rule", "'nope'")
    assert line.startswith("error: --rule: unknown rule 'nope' (known: ")


# ------------------------------------------------- library messages name parameters

def _raised(call):
    with pytest.raises(EvolveError) as e:
        call()
    return e.value


def test_library_errors_name_parameters_not_options(tmp_path, small_data_dir):
    from evolve import api
    from evolve.runs import report, rundir
    from evolve.io import paths
    cases = [
        (lambda: paths.runs_dir(""), "runs_dir", "runs_dir: an empty value is not allowed"),
        (lambda: rundir.check_name("../x"), "name", "name: '../x' is not a valid run name"),
        (lambda: report.benchmark(small_data_dir, ["nope"], 1), "heuristics",
         "heuristics: unknown rule 'nope'"),
        (lambda: api.run(data_dir=small_data_dir, runs_dir=tmp_path, resume="nope"),
         "resume", "resume: 'nope': "),
    ]
    blocker = tmp_path / "file"
    blocker.write_text("")
    cases.append((lambda: api.run(data_dir=small_data_dir, runs_dir=blocker, generations=1,
                                  population=40, writeback=False),
                  "runs_dir", f"runs_dir: {blocker}: exists and is not a directory"))
    for call, param, start in cases:
        e = _raised(call)
        assert e.param == param and str(e).startswith(start), (param, str(e))
        assert not str(e).startswith("--") and str(e) == f"{param}: {e.detail}", str(e)
        assert e.named("--opt") == f"--opt: {e.detail}"


# ------------------------------------------------------- a cluster error stays one

@pytest.mark.parametrize("kind", ["error", "interrupted"])
def test_a_cluster_error_while_restoring_is_not_a_damaged_checkpoint(monkeypatch, tmp_path,
                                                                       small_data_dir, kind):
    """A ClusterError is a ValueError now; one raised while a resume restores its
    checkpoint (an old checkpoint scores its hall of fame on valid) is still the
    cluster's failure (or stop, exit code 130), never "cannot restore" the checkpoint."""
    from evolve.cluster import ClusterError, ClusterInterrupted
    from evolve.search.engine import Evolution
    runs = tmp_path / "runs"
    r = invoke("run", "--data", small_data_dir, "--runs-dir", runs, "--name", "r",
               "--generations", 1, "--population", 40, "--no-writeback", "--json")
    assert r.exit_code == 0, r.output
    exc = (ClusterError("tcp://h:1: not done within 5 s") if kind == "error"
           else ClusterInterrupted("stopped while waiting for the cluster"))

    def restore(self, state):
        raise exc
    monkeypatch.setattr(Evolution, "restore", restore)
    r = invoke("run", "--resume", "r", "--runs-dir", runs, "--generations", 2)
    assert "cannot restore" not in r.stderr, r.stderr
    if kind == "error":
        one_line_error(r, "tcp://h:1: not done within 5 s")
    else:
        assert r.exit_code == 130 and "stopped while waiting" in r.stderr, (r.exit_code,
                                                                            r.stderr)


# ------------------------------------------------------------ first line of an error

def test_first_line():
    assert first_line(ValueError("\n  bad value \nmore")) == "bad value"
    assert first_line(ValueError("")) == "ValueError"
    assert first_line(KeyError("k")) == "'k'"
    assert first_line(OSError("x" * 500), 120) == "x" * 120


def test_first_line_is_defined_once():
    """The helper lives in evolve/errors.py only; every module uses it."""
    root = Path(evolve.__file__).parent
    pattern = re.compile(r"^\s*def \w*(first_line|short_error)\w*\(", re.M)
    where = [str(p.relative_to(root)) for p in sorted(root.rglob("*.py"))
             if pattern.search(p.read_text(encoding="utf-8"))]
    assert where == ["errors.py"], where
    assert errors.first_line is first_line
