"""``python -m benchmarks.speed.gpu_check``: every GPU figure in one command. Here, without a
GPU, ``--smoke`` runs every section end to end on the CPU (the fused kernels in Triton's
interpreter), the results compared with the Numba kernels before anything is timed; no
figure is judged against a target. The packages a GPU machine lacks install from a
folder of wheels, without an index; a missing GPU, Triton or wheel is one line and exit
code 2.

Guarantee 41 of docs/reliability.md, The GPU check refuses bad options before any work
(`test_bad_options_are_one_line_before_any_work`)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ["-m", "benchmarks.speed.gpu_check"]
from benchmarks.speed import gpu_check  # noqa: E402


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")
def test_smoke_runs_every_section_and_prints_one_table(tmp_path):
    out = tmp_path / "check.json"
    r = subprocess.run([sys.executable, *SCRIPT, "--smoke", "--json", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(out.read_text())
    lines = r.stdout.splitlines()
    assert lines[0] == doc["title"] and "torch" in lines[0] and "Triton" in lines[0]
    for what in ("token kernel", "trace generation", "hf recorder", "free-running",
                 "drop-in in generate", "label mining"):
        assert any(line.startswith(what) for line in lines), (what, r.stdout)
    assert "not run" not in r.stdout
    tok, tr = doc["kernels"]["token"], doc["kernels"]["trace"]
    assert tok["identical"] and tr["identical"] and tok["kernels"] == ["fused", "torch"]
    for k in ("fused", "torch", "numba"):
        assert tok[f"{k}_node_evals_per_s"] > 0 and tr[f"{k}_node_evals_per_s"] > 0
    assert set(doc["recorder"]) == set(doc["dropin"]) == {"8", "32"}
    for res in doc["recorder"].values():
        assert res["record"]["total_vs_minimal"] > 0 and res["free"]["total_vs_minimal"] > 0
    for res in doc["dropin"].values():
        assert res["dropin_tokens_per_s"] > 0 and res["own_tokens_per_s"] > 0
        assert res["calls"] > 0
    mined = doc["mining"]["smoke"]
    assert mined["mining_rows_per_s"] > 0 and mined["minimal_rows_per_s"] > 0
    assert 0 < mined["rows_needed"] < mined["rows_minimal"]
    if not torch.cuda.is_available():
        assert "no GPU" in lines[0] and lines[-1].startswith("smoke sizes")
        assert all(row[-1] in ("", "-") for row in gpu_check.rows(doc))   # nothing judged


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here")
@pytest.mark.parametrize("how", ["module", "path"])
def test_without_a_gpu_and_without_smoke_it_is_one_line(how, tmp_path):
    """``python -m benchmarks.speed.gpu_check`` from the checkout, and ``python
    benchmarks/gpu_check.py`` from anywhere: the same command."""
    cmd = SCRIPT if how == "module" else [str(ROOT / "benchmarks" / "gpu_check.py")]
    r = subprocess.run([sys.executable, *cmd], cwd=ROOT if how == "module" else tmp_path,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and "no CUDA device" in r.stderr and "--smoke" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("args,needles", [
    (["--json", "/proc/nope/x.json"], ["--json", "/proc/nope", "does not exist"]),
    (["--json", "DIR"], ["--json", "a directory"]),
    (["--json", ""], ["--json", "empty"]),
    (["--budget", "-1"], ["--budget", "-1", "> 0"]),
    (["--budget", "0"], ["--budget", "> 0"]),
    (["--budget", "nan"], ["--budget", "nan"]),
    (["--budget", "inf"], ["--budget", "inf"]),
])
def test_bad_options_are_one_line_before_any_work(monkeypatch, capsys, tmp_path, args, needles):
    """An unusable --json used to crash at the first save, about 9 s in, and a budget
    of -1 or nan was taken; both are refused before anything runs."""
    monkeypatch.setattr(gpu_check, "run", lambda args: pytest.fail("work was started"))
    args = [str(tmp_path) if a == "DIR" else a for a in args]
    assert gpu_check.main(["--smoke", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gpu_check: "), err
    for needle in needles:
        assert needle in err, err


def test_without_triton_it_is_one_line(monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "triton" else real(name, *a))
    monkeypatch.setattr(gpu_check, "REQUIRED", {"numpy": "numpy"})
    assert gpu_check.main(["--smoke"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "triton does not import" in err


def _wheel(folder: Path, name: str) -> Path:
    """A minimal pure-Python wheel of a package ``name`` that sets ``VALUE = 42``."""
    dist = f"{name}-0.1.dist-info"
    path = folder / f"{name}-0.1-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{name}/__init__.py", "VALUE = 42\n")
        z.writestr(f"{dist}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
        z.writestr(f"{dist}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: "
                                    "true\nTag: py3-none-any\n")
        z.writestr(f"{dist}/RECORD", "")
    return path


def test_missing_packages_install_from_the_wheels_alone(tmp_path, monkeypatch):
    name = "gpu_check_dummy_pkg"
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    required = {name: name}
    monkeypatch.setattr(gpu_check, "REQUIRED", required)
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert gpu_check.missing(required) == [name]
    with pytest.raises(gpu_check.CheckError, match="no wheels in .*benchmarks.speed.gpu_wheels"):
        gpu_check.install([name], wheels, tmp_path / "site")
    _wheel(wheels, name)
    gpu_check.install([name], wheels, tmp_path / "site")
    assert gpu_check.missing(required) == []
    assert importlib.import_module(name).VALUE == 42
    assert (tmp_path / "site" / name / "__init__.py").is_file()
    with pytest.raises(gpu_check.CheckError, match="installing gpu_check_absent from"):
        gpu_check.install(["gpu_check_absent"], wheels, tmp_path / "site")
    sys.modules.pop(name, None)
