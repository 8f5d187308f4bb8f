"""The command line as the tests drive it: one way to invoke it and one check of
the one-line error every refusal must be."""

import pytest
from click.testing import CliRunner

from evolve.cli import main
from evolve.io import paths

ENV = {"COLUMNS": "160", "NO_COLOR": "1"}


def invoke(*args, env=None):
    return CliRunner().invoke(main, [str(a) for a in args], env={**ENV, **(env or {})})


def one_line_error(r, *needles) -> str:
    """Exit code 2, exactly one line on stderr starting with "error: ", no
    traceback, every needle in it; returns the line."""
    assert r.exit_code == 2, (r.exit_code, r.output, r.exception)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert "Traceback" not in r.output
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


@pytest.fixture
def isolated(tmp_path_factory, monkeypatch):
    """Defaults that would reach the repository point into a temporary directory
    (import it into a module and mark it used: ``pytestmark = usefixtures``)."""
    guard = tmp_path_factory.mktemp("guard")
    monkeypatch.setenv("EVOLVE_RUNS_DIR", str(guard / "runs"))
    monkeypatch.setenv("EVOLVE_HEURISTICS_DIR", str(guard / "heuristics"))
    monkeypatch.setattr(paths, "HEURISTICS_DIR", guard / "heuristics-default")


SCOPE = {"top_k": None, "vocab_size": 256, "block_size": 4, "temperature": 1.0,
         "truncation": None, "backend": "ngram"}


def fake_trace_run(parent, name: str, tree: str, objective: str = "speed", scope=None,
                   standing=None):
    """A minimal trace run directory (config and champion) for export and compare tests:
    the champion was scored with ``scope`` (default ``SCOPE``: every token, g = 4)."""
    import json
    from pathlib import Path
    path = Path(parent) / name
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(
        {"format": "evolve-run", "version": 1, "name": name, "config": {"seed": 0},
         "data": {"dir": ""}}))
    (path / "champion.json").write_text(json.dumps(
        {"tree": tree, "objective": objective, "tv_budget": 0.03,
         "metrics": {s: {"tokens_per_call": 2.5, "tv_per_token": 0.01, "kl_per_token": 0.001}
                     for s in ("valid", "test")},
         "scope": dict(SCOPE) if scope is None else scope,
         **({} if standing is None else {"standing": standing})}))
    return path
