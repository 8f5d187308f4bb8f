"""Sharded evaluation (evolve.cluster): in-process and on a 2-worker Dask cluster,
1, 2 and 3 shards give the history, champion and checkpoint of the .npz run; a
cluster that cannot be reached is one line; a worker killed mid-run is retried
or stops the run cleanly, and --resume continues exactly.

Also guarantee 29 of docs/reliability.md, Trace schema v3: slot features, checked like
the rest: see tests/test_untrusted_files.py.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from evolve.data import shards as S
from evolve.data.shard_writer import shard_dir
from evolve.data import traces as T
from tests import tracekit
from tests.conftest import TINY
from tests.clikit import invoke, one_line_error

distributed = pytest.importorskip("distributed")

RUN = ("--objective", "speed", "--generations", TINY["generations"], "--population",
       TINY["population"], "--no-writeback", "--json")
SHARD_COUNTS = (1, 2, 3)
KILL_RUN = {"generations": 25, "population": 120}     # long enough to kill a worker mid-run
ROOT = Path(__file__).resolve().parents[1]


def run_files(path):
    """What must be identical: history without timings, checkpoint, champion."""
    hist = [json.loads(l) for l in (path / "history.jsonl").read_text().splitlines()]
    for rec in hist:
        rec.pop("timing")
    return {"history": hist, "checkpoint": json.loads((path / "checkpoint.json").read_text()),
            "champion": json.loads((path / "champion.json").read_text()),
            "hall_of_fame": json.loads((path / "hall_of_fame.json").read_text())}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """The tiny traces as .npz and sharded so train has 1, 2 and 3 shards."""
    d = tmp_path_factory.mktemp("cluster_traces")
    for s in T.SPLITS:
        T.save(tracekit.split(s), d / f"{s}.npz")
    rows = len(tracekit.split("train"))
    out = {"npz": d}
    for n in SHARD_COUNTS:
        shard_dir(d, d / f"shards{n}", -(-rows // n))
        assert len(S.open_split(d / f"shards{n}" / "train").shards) == n
    out.update({n: d / f"shards{n}" for n in SHARD_COUNTS})
    return out


@pytest.fixture(scope="module")
def reference(data, tmp_path_factory):
    runs = tmp_path_factory.mktemp("ref_runs")
    r = invoke("run", *RUN, "--data", data["npz"], "--runs-dir", runs, "--name", "ref")
    assert r.exit_code == 0, r.output
    return run_files(runs / "ref")


@pytest.mark.parametrize("n", SHARD_COUNTS)
def test_in_process_shards_match_the_npz_run(data, reference, tmp_path, n):
    r = invoke("run", *RUN, "--data", data[n], "--runs-dir", tmp_path, "--name", "s")
    assert r.exit_code == 0, r.output
    assert run_files(tmp_path / "s") == reference


def test_p99_cap_reaches_the_shards(data, reference, tmp_path):
    """--cap-tv-p99 is summed where the shards are: the sharded run equals the .npz
    run with the same cap, and the cap changed the search."""
    cap = ("--cap-tv-p99", "0.01")
    r = invoke("run", *RUN, *cap, "--data", data["npz"], "--runs-dir", tmp_path, "--name", "n")
    assert r.exit_code == 0, r.output
    r = invoke("run", *RUN, *cap, "--data", data[2], "--runs-dir", tmp_path, "--name", "s")
    assert r.exit_code == 0, r.output
    capped = run_files(tmp_path / "n")
    assert run_files(tmp_path / "s") == capped
    assert capped["history"] != reference["history"]


@pytest.fixture(scope="module")
def scheduler():
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=":0") as cluster:
        yield cluster.scheduler_address


@pytest.mark.slow
def test_two_worker_cluster_matches_the_npz_run(data, reference, scheduler, tmp_path):
    for n in SHARD_COUNTS:
        r = invoke("run", *RUN, "--data", data[n], "--runs-dir", tmp_path, "--name", f"c{n}",
                   "--scheduler", scheduler)
        assert r.exit_code == 0, r.output
        assert run_files(tmp_path / f"c{n}") == reference, n
    r = invoke("run", *RUN, "--data", data[3], "--runs-dir", tmp_path, "--name", "local",
               "--cluster", "local:2")
    assert r.exit_code == 0, r.output
    assert run_files(tmp_path / "local") == reference


def test_unreachable_scheduler_and_bad_options_are_one_line(data, tmp_path, monkeypatch):
    # a closed port is refused at once, and retried until the connect limit (30 s by
    # default): 3 s here
    monkeypatch.setenv("EVOLVE_CLUSTER_CONNECT_TIMEOUT", "3")
    one_line_error(invoke("run", *RUN, "--data", data[2], "--runs-dir", tmp_path,
                          "--scheduler", "tcp://127.0.0.1:9"), "--scheduler", "127.0.0.1:9")
    one_line_error(invoke("run", *RUN, "--data", data[2], "--runs-dir", tmp_path,
                          "--cluster", "remote:2"), "--cluster", "local:N")
    one_line_error(invoke("run", *RUN, "--data", data["npz"], "--runs-dir", tmp_path,
                          "--cluster", "local:1"), "--cluster", "sharded")
    one_line_error(invoke("run", *RUN, "--data", data[2], "--runs-dir", tmp_path,
                          "--cluster", "local:1", "--scheduler", "tcp://127.0.0.1:9"),
                   "--cluster and --scheduler")
    assert not any(tmp_path.iterdir())         # nothing was created


def test_missing_extra_is_one_line_with_the_install_command(data, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "distributed", None)     # import distributed fails
    one_line_error(invoke("run", *RUN, "--data", data[2], "--runs-dir", tmp_path,
                          "--cluster", "local:2"), "--cluster", "pip install -e '.[cluster]'")
    assert not any(tmp_path.iterdir())


def _workers(proc):
    import psutil
    kids = psutil.Process(proc.pid).children(recursive=True)
    return [p for p in kids if "spawn_main" in " ".join(p.cmdline())]


@pytest.mark.slow
@pytest.mark.parametrize("allowed_failures", ["3", "0"])
def test_worker_killed_mid_run_is_retried_or_stops_and_resumes_exactly(data, tmp_path,
                                                                      allowed_failures):
    opts = ["--objective", "speed", "--generations", str(KILL_RUN["generations"]),
            "--population", str(KILL_RUN["population"]), "--no-writeback"]
    r = invoke("run", *opts, "--data", data["npz"], "--runs-dir", tmp_path, "--name", "ref")
    assert r.exit_code == 0, r.output
    want = run_files(tmp_path / "ref")
    env = dict(os.environ, PYTHONPATH=str(ROOT), NO_COLOR="1",
               # 0: no retry, a worker killed while scoring stops the run
               DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES=allowed_failures)
    proc = subprocess.Popen([sys.executable, "-m", "evolve", "run", *opts, "--data",
                             str(data[3]), "--runs-dir", str(tmp_path), "--name", "k",
                             "--cluster", "local:2"], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    hist = tmp_path / "k" / "history.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None and not (
            hist.exists() and len(hist.read_text().splitlines()) >= 2):
        time.sleep(0.05)
    workers = _workers(proc)
    assert proc.poll() is None and workers, "the run ended before a worker could be killed"
    os.kill(workers[0].pid, signal.SIGKILL)
    out, err = proc.communicate(timeout=300)
    print(f"worker killed (allowed failures {allowed_failures}): exit code {proc.returncode}")
    if allowed_failures != "0":       # the lost shards are loaded again, the scores rerun
        assert proc.returncode == 0, err
    if proc.returncode == 2:          # stopped: one line, checkpoint intact, resume exact
        errors = [l for l in err.splitlines() if l.startswith("error:")]
        assert len(errors) == 1 and "resume with" in errors[0], err
        assert err.rstrip().endswith(errors[0]) and "Traceback" not in err, err
        assert json.loads((tmp_path / "k" / "summary.json").read_text())["status"] == "failed"
        r = invoke("run", "--resume", "k", "--runs-dir", tmp_path, "--no-writeback")
        assert r.exit_code == 0, r.output
    else:                             # retried on the workers left
        assert proc.returncode == 0, err
    assert run_files(tmp_path / "k") == want


@pytest.mark.slow
def test_cluster_benchmark_smoke(tmp_path):
    """benchmarks/speed/cluster.py on a tiny set: every configuration, the same sums."""
    out = tmp_path / "bench.json"
    p = subprocess.run([sys.executable, "-m", "benchmarks.speed.cluster", "--smoke",
                        "--work", str(tmp_path / "work"), "--json", str(out)],
                       cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["identical_sums"] and len(doc["results"]) == 3
    assert {r["mode"] for r in doc["results"]} == {"in-process", "local:2"}
    assert all(r["driver_peak_rss_mb"] > 0 for r in doc["results"])
