"""Hostile clusters: Ctrl-C from a terminal (SIGINT to the whole process group) on
a LocalCluster run, a scheduler that accepts connections and never answers (at
the start, or from the middle of a run), and addresses or specs that are not
what --cluster and --scheduler take. Each test fails without the behaviour it
names; every wait in them is bounded.

Runs use a temporary --runs-dir and --no-writeback, tiny traces (tests/tracekit)
cut into 2 shards, and short limits set in the environment.

Guarantee 27 of docs/reliability.md, Clusters: Ctrl-C, silent schedulers and bad addresses:

A terminal's Ctrl-C sends SIGINT to the whole process group, so the workers of
`--cluster local:N` get it too. They ignore it: they are started from a thread that
blocks SIGINT (the block is inherited by the processes it spawns), and a worker
preload (`evolve.cluster.worker.dask_setup`) sets SIGINT to be ignored. The driver
owns the stop, and guarantee 2 holds for cluster runs: the generation finishes, then
the checkpoint and `summary.json` (`interrupted`) are written, the resume command
(with `--cluster`/`--scheduler`) is printed, and the exit code is 130. The printed
command then completes the run, with the same history, checkpoint and champion as an
uninterrupted in-process run. Test (a real `LocalCluster`, SIGINT sent with
`os.killpg`):
`test_ctrl_c_to_the_process_group_stops_a_cluster_run_and_resume_completes`. Every
wait on a scheduler has a limit, and SIGINT or SIGTERM ends it. The limits can be
set in the environment: reaching the scheduler (connection, handshake, its list of
workers, a worker joining) within `EVOLVE_CLUSTER_CONNECT_TIMEOUT` (30 s), and each
call of a generation (all shards scored and gathered) or the loading of the shards
within `EVOLVE_CLUSTER_CALL_TIMEOUT` (3600 s). A scheduler that accepts the
connection and never answers (a dead tunnel) therefore ends the run with one line
and exit code 2. At the start nothing is created. Mid-run, the run is marked
`failed`, its last checkpoint is intact, and the line ends with the resume command.
A signal while connecting ends the wait at once with one line and exit code 130, and
nothing is created or changed. A signal during a generation that does not finish
within `EVOLVE_CLUSTER_STOP_GRACE` (30 s) abandons that generation: the run stops at
its last checkpoint, with status `interrupted` and exit code 130. Closing the client
and the cluster is bounded too. Tests (a TCP server on 127.0.0.1 that accepts and
never replies, and a forwarding tunnel that goes silent mid-run):
`test_silent_scheduler_is_one_line_within_the_connect_limit`,
`test_signal_ends_a_wait_on_a_silent_scheduler[SIGTERM|SIGINT]`,
`test_scheduler_going_silent_mid_run_is_bounded_and_resumes[limit|SIGINT]`
(it resumes with the printed command once the tunnel works again; SIGTERM takes the
same path as SIGINT there, and its own handling is tested while connecting and in
`tests/test_interrupts.py`),
`test_a_scheduler_without_workers_is_one_line_within_the_connect_limit` (a scheduler
that answers, with no worker ever joining) and
`test_closing_a_client_that_never_returns_is_bounded`. `--cluster` and `--scheduler`
are checked before anything is created, also with `--starts`. `--cluster` takes only
`local:N`, with N an ASCII whole number from 1 to four times the core count (at
least 4). `--scheduler` takes only `tcp://HOST:PORT`, `tls://HOST:PORT` or
`HOST:PORT`, where the port is 1 to 65535 and the host is a name or an IP address.
Whatever else they are given, they refuse with one line that echoes the value
(escaped), exit code 2: another scheme (`ucx://`, `ws://`, `inproc://`), a missing
or out-of-range port, a host with spaces or a newline, an empty value (once quietly
in-process), `local:²`, `local:0` or `local:10⁵⁰`. The limits in the environment are
checked the same way. Anything connecting raises (a `tls://` address without TLS set
up in Dask's configuration raises TypeError) becomes one line too. Tests:
`test_bad_scheduler_address_is_one_line_before_any_work`,
`test_bad_cluster_spec_is_one_line_before_any_work`,
`test_cluster_bound_follows_the_cores`, `test_tls_without_certificates_is_one_line`
and `test_bad_limit_in_the_environment_is_one_line` (all in
`tests/test_hostile_cluster.py`).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from evolve.data.shard_writer import shard_dir
from evolve.data import traces as T
from tests import tracekit
from tests.clikit import ENV, invoke, isolated, one_line_error  # noqa: F401 (isolated: a fixture)

distributed = pytest.importorskip("distributed")

pytestmark = pytest.mark.usefixtures("isolated")

ROOT = Path(__file__).resolve().parents[1]
RUN = ("--objective", "speed", "--no-writeback")
TINY = (*RUN, "--generations", "2", "--population", "40")   # if a refusal were missing
SIGINT_RUN = {"generations": 12, "population": 400}   # a generation takes about a second
START_S = 240          # the longest a run may take to log its first generation
END_S = 120            # the longest a run may take to end once told to


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """The tiny traces as .npz and cut into 2 shards a split."""
    d = tmp_path_factory.mktemp("hostile_cluster_traces")
    for s in T.SPLITS:
        T.save(tracekit.split(s), d / f"{s}.npz")
    shard_dir(d, d / "shards", -(-len(tracekit.split("train")) // 2))
    return {"npz": d, "shards": d / "shards"}


def env(tmp_path, **extra) -> dict:
    return {**os.environ, **ENV, "PYTHONPATH": str(ROOT),
            "EVOLVE_RUNS_DIR": str(tmp_path / "default-runs"),
            "EVOLVE_HEURISTICS_DIR": str(tmp_path / "default-heuristics"), **extra}


def start(tmp_path, *args, **extra_env) -> subprocess.Popen:
    """``evolve ARGS`` in a session (and process group) of its own, as a terminal
    would run it."""
    return subprocess.Popen([sys.executable, "-m", "evolve", *map(str, args)], cwd=ROOT,
                            env=env(tmp_path, **extra_env), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def finish(proc: subprocess.Popen, timeout: float = END_S) -> tuple[int, str, str]:
    """Wait for ``proc`` at most ``timeout`` s; kill its whole group if it is still
    running (and fail)."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=30)
        pytest.fail(f"still running {timeout} s later; stderr: {err[-3000:]}")
    return proc.returncode, out, err


def wait_until(cond, timeout: float, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if proc is not None and proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"ended early ({proc.returncode}): {err[-3000:]}")
        if time.monotonic() > deadline:
            if proc is not None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate(timeout=30)
            pytest.fail(f"not reached within {timeout} s")
        time.sleep(0.05)


def history_lines(run_dir: Path) -> int:
    try:
        return (run_dir / "history.jsonl").read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def run_files(path: Path) -> dict:
    hist = [json.loads(line) for line in (path / "history.jsonl").read_text().splitlines()]
    for rec in hist:
        rec.pop("timing")
    return {"history": hist, "checkpoint": json.loads((path / "checkpoint.json").read_text()),
            "champion": json.loads((path / "champion.json").read_text())}


def one_error_line(err: str, *needles) -> str:
    """The one error line on stderr, its last line (progress lines and the note that
    a signal was received may come before it), no traceback."""
    lines = [line for line in err.splitlines() if line.startswith("error")]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert err.rstrip().endswith(lines[0]) and "Traceback" not in err, err
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


def resume(tmp_path, command: str, **extra_env) -> subprocess.CompletedProcess:
    """The printed resume command, run as printed (``evolve`` is this package)."""
    parts = shlex.split(command)
    assert parts[:3] == ["evolve", "run", "--resume"], command
    return subprocess.run([sys.executable, "-m", "evolve", *parts[1:]], cwd=ROOT,
                          env=env(tmp_path, **extra_env), capture_output=True, text=True,
                          timeout=START_S + END_S)


# ----------------------------------------------------------- Ctrl-C from a terminal

@pytest.mark.slow
def test_ctrl_c_to_the_process_group_stops_a_cluster_run_and_resume_completes(
        shards, tmp_path):
    """SIGINT to the whole group (driver and LocalCluster workers, as a terminal's
    Ctrl-C): the workers ignore it, the driver finishes the generation, saves, writes
    summary.json (interrupted) and exits 130; the printed command resumes the run to
    the result of an uninterrupted one."""
    opts = [*RUN, "--generations", SIGINT_RUN["generations"],
            "--population", SIGINT_RUN["population"]]
    r = invoke("run", *opts, "--data", shards["npz"], "--runs-dir", tmp_path, "--name", "ref")
    assert r.exit_code == 0, r.output
    proc = start(tmp_path, "run", *opts, "--data", shards["shards"], "--runs-dir", tmp_path,
                 "--name", "k", "--cluster", "local:2")
    wait_until(lambda: history_lines(tmp_path / "k") >= 1, START_S, proc)
    os.killpg(proc.pid, signal.SIGINT)
    code, out, err = finish(proc)
    assert code == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    summary = json.loads((tmp_path / "k" / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["signal"] == "SIGINT", summary
    assert summary["generation"] < SIGINT_RUN["generations"]
    assert summary["generation"] == history_lines(tmp_path / "k") - 1
    printed = [line for line in err.splitlines() if line.startswith("interrupted: ")]
    assert printed == [err.strip().splitlines()[-1]], err       # one line, the last
    assert printed[0].startswith("interrupted: evolve run: at generation ") and \
        printed[0].endswith(f"; resume with: {summary['resume']}"), err
    assert "--cluster local:2" in summary["resume"]
    res = resume(tmp_path, summary["resume"])
    assert res.returncode == 0, res.stderr[-3000:]
    assert json.loads((tmp_path / "k" / "summary.json").read_text())["status"] == "finished"
    assert run_files(tmp_path / "k") == run_files(tmp_path / "ref")


# -------------------------------------------------- a scheduler that never answers

class SilentServer:
    """Accepts TCP connections on 127.0.0.1 and never sends a byte (a dead tunnel);
    stops itself after ``life_s`` seconds at most."""

    def __init__(self, life_s: float = 300.0):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.conns: list = []
        self._end = time.monotonic() + life_s
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while not self._stop.is_set() and time.monotonic() < self._end:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.conns.append(conn)
            self.accepted += 1
        self._close()

    def _close(self):
        for c in self.conns:
            c.close()
        self.sock.close()

    def stop(self):
        self._stop.set()
        self.thread.join(5)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


@pytest.mark.slow
def test_silent_scheduler_is_one_line_within_the_connect_limit(shards, tmp_path):
    with SilentServer() as server:
        t0 = time.monotonic()
        proc = start(tmp_path, "run", *RUN, "--generations", 2, "--population", 40, "--data",
                     shards["shards"], "--runs-dir", tmp_path / "runs", "--scheduler",
                     f"tcp://127.0.0.1:{server.port}", EVOLVE_CLUSTER_CONNECT_TIMEOUT="2")
        code, out, err = finish(proc, 90)
        assert server.accepted >= 1
    assert code == 2, err
    one_error_line(err, "--scheduler", f"127.0.0.1:{server.port}", "no answer within 2 s",
                   "EVOLVE_CLUSTER_CONNECT_TIMEOUT")
    assert time.monotonic() - t0 < 90
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_ends_a_wait_on_a_silent_scheduler(shards, tmp_path, sig):
    """With the default (long) limit, SIGTERM or SIGINT ends the wait at once: exit
    130, one line, nothing made."""
    with SilentServer() as server:
        proc = start(tmp_path, "run", *RUN, "--generations", 2, "--population", 40, "--data",
                     shards["shards"], "--runs-dir", tmp_path / "runs", "--scheduler",
                     f"127.0.0.1:{server.port}")
        wait_until(lambda: server.accepted >= 1, START_S, proc)
        time.sleep(0.5)
        t0 = time.monotonic()
        os.kill(proc.pid, sig)
        code, out, err = finish(proc, 30)
        assert time.monotonic() - t0 < 30
    assert code == 130, err
    line = err.strip().splitlines()[-1]          # the one line of an interrupted command
    assert line.startswith("interrupted: evolve run: --scheduler") and \
        "nothing was changed" in line and "Traceback" not in err, err
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_a_scheduler_without_workers_is_one_line_within_the_connect_limit(shards, tmp_path):
    """A scheduler that answers but has no worker, and none joins: the wait for one ends
    at EVOLVE_CLUSTER_CONNECT_TIMEOUT with one line, exit 2, nothing made."""
    with distributed.LocalCluster(n_workers=0, processes=False, protocol="tcp",
                                  dashboard_address=":0") as empty:
        proc = start(tmp_path, "run", *RUN, "--generations", 2, "--population", 40, "--data",
                     shards["shards"], "--runs-dir", tmp_path / "runs", "--scheduler",
                     empty.scheduler_address, EVOLVE_CLUSTER_CONNECT_TIMEOUT="2")
        code, out, err = finish(proc, 90)
    assert code == 2, err
    one_error_line(err, "--scheduler", "no workers joined within 2 s")
    assert not (tmp_path / "runs").exists()


def test_closing_a_client_that_never_returns_is_bounded(monkeypatch):
    """Session.close waits at most CLOSE_S for each close (a scheduler that no longer
    answers would hold the run's end forever): it returns while the close it called
    is still blocked."""
    from evolve.cluster import session as session_mod
    monkeypatch.setattr(session_mod, "CLOSE_S", 0.2)
    release = threading.Event()

    class Stuck:
        returned = False

        def close(self):
            release.wait(20)
            Stuck.returned = True
    s = session_mod.Session()
    s.client = Stuck()
    try:
        s.close()
        assert s.client is None and not Stuck.returned
    finally:
        release.set()


class Tunnel:
    """A TCP forwarder from 127.0.0.1 to ``target`` that can go silent: once
    ``freeze()`` is called it keeps every connection open and forwards nothing (a
    tunnel whose far end is gone); ``thaw()`` forwards again."""

    def __init__(self, target: str, life_s: float = 600.0):
        host, port = target.rsplit("//", 1)[-1].rsplit(":", 1)
        self.target = (host, int(port))
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.frozen = threading.Event()
        self._end = time.monotonic() + life_s
        self._stop = threading.Event()
        self.conns: list = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _alive(self) -> bool:
        return not self._stop.is_set() and time.monotonic() < self._end

    def _serve(self):
        while self._alive():
            try:
                a, _ = self.sock.accept()
            except OSError:
                continue
            self.conns.append(a)
            if self.frozen.is_set():
                continue
            b = socket.create_connection(self.target, timeout=10)
            self.conns.append(b)
            for src, dst in ((a, b), (b, a)):
                threading.Thread(target=self._pipe, args=(src, dst), daemon=True).start()
        self.sock.close()
        for c in self.conns:
            c.close()

    def _pipe(self, src, dst):
        src.settimeout(0.2)
        while self._alive():
            if self.frozen.is_set():
                time.sleep(0.05)
                continue
            try:
                data = src.recv(65536)
            except socket.timeout:
                continue
            except OSError:
                return
            if not data:
                return
            try:
                dst.sendall(data)
            except OSError:
                return

    def freeze(self):
        self.frozen.set()

    def thaw(self):
        self.frozen.clear()

    def close(self):
        self._stop.set()


@pytest.fixture
def cluster():
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                                  dashboard_address=":0") as c:
        yield c.scheduler_address


@pytest.mark.slow
@pytest.mark.parametrize("how", ["limit", "SIGINT"])
def test_scheduler_going_silent_mid_run_is_bounded_and_resumes(shards, tmp_path, cluster,
                                                              how):
    """The scheduler stops answering after the first generation (its tunnel died).
    ``limit``: the generation's wait ends at EVOLVE_CLUSTER_CALL_TIMEOUT: one line
    with the resume command, exit 2, summary failed. ``SIGINT`` (Ctrl-C; SIGTERM is
    handled by the same stop, tested with ``test_interrupts.py``):
    the generation is abandoned after EVOLVE_CLUSTER_STOP_GRACE: exit 130, summary
    interrupted. Either way the last checkpoint is intact and the printed command
    resumes the run once the tunnel works again."""
    tunnel = Tunnel(cluster)
    limits = {"EVOLVE_CLUSTER_CONNECT_TIMEOUT": "3", "EVOLVE_CLUSTER_STOP_GRACE": "2",
              "EVOLVE_CLUSTER_CALL_TIMEOUT": "6" if how == "limit" else "600"}
    try:
        proc = start(tmp_path, "run", *RUN, "--generations", 15, "--population", 200,
                     "--data", shards["shards"], "--runs-dir", tmp_path, "--name", "t",
                     "--scheduler", f"tcp://127.0.0.1:{tunnel.port}", **limits)
        wait_until(lambda: history_lines(tmp_path / "t") >= 1, START_S, proc)
        tunnel.freeze()
        t0 = time.monotonic()
        if how != "limit":
            time.sleep(1)
            os.kill(proc.pid, getattr(signal, how))
        code, out, err = finish(proc, 60)
        assert time.monotonic() - t0 < 60
        summary = json.loads((tmp_path / "t" / "summary.json").read_text())
        if how == "limit":
            assert code == 2, err
            line = one_error_line(err, "--scheduler", "EVOLVE_CLUSTER", "resume with: ")
            command = line.split("resume with: ", 1)[1]
            assert summary["status"] == "failed", summary
        else:
            assert code == 130, err
            assert "Traceback" not in err, err
            assert summary["status"] == "interrupted" and summary["signal"] == how
            assert summary["generation"] == history_lines(tmp_path / "t") - 1
            command = summary["resume"]
        tunnel.thaw()
        res = resume(tmp_path, command, **{**limits, "EVOLVE_CLUSTER_CALL_TIMEOUT": "600"})
        assert res.returncode == 0, res.stderr[-3000:]
        assert json.loads((tmp_path / "t" / "summary.json").read_text())["status"] == \
            "finished"
    finally:
        tunnel.close()


# ------------------------------------------------------------ addresses and specs

BAD_SCHEDULERS = [
    ("", "empty"),
    ("   ", "empty"),
    ("ucx://127.0.0.1:8786", "scheme 'ucx'"),
    ("inproc://127.0.0.1/1/1", "scheme 'inproc'"),
    ("ws://127.0.0.1:8786", "scheme 'ws'"),
    ("tcp://127.0.0.1", "port"),
    ("tcp://127.0.0.1:0", "port"),
    ("tcp://127.0.0.1:99999", "port"),
    ("tcp://127.0.0.1:²", "port"),
    ("tcp://:8786", "host"),
    ("tcp://a b:8786", "host"),
    ("tcp://host\nerror: forged:1", "host"),
    ("tcp://" + "a" * 5000 + ":1", "longer than"),
]


@pytest.mark.parametrize("address,needle", BAD_SCHEDULERS)
def test_bad_scheduler_address_is_one_line_before_any_work(shards, tmp_path, address,
                                                           needle):
    for starts in ("1", "2"):          # --starts 2 makes a parent run: refused first
        line = one_line_error(invoke("run", *TINY, "--data", shards["shards"], "--runs-dir",
                                     tmp_path / "runs", "--starts", starts,
                                     "--scheduler", address), "--scheduler", needle)
        assert "\n" not in line
    assert not (tmp_path / "runs").exists()


BAD_CLUSTERS = [
    ("", "local:N"),
    ("local:²", "local:N"),
    ("local:٣", "local:N"),
    ("local:0", "local:N"),
    ("local:-1", "local:N"),
    ("local: 2", "local:N"),
    ("local:2\n", "local:N"),
    ("local:" + "9" * 50, "local:N"),
    ("local:100000", "at most local:"),
]


@pytest.mark.parametrize("spec,needle", BAD_CLUSTERS)
def test_bad_cluster_spec_is_one_line_before_any_work(shards, tmp_path, spec, needle):
    for starts in ("1", "2"):
        one_line_error(invoke("run", *TINY, "--data", shards["shards"], "--runs-dir",
                              tmp_path / "runs", "--starts", starts, "--cluster", spec),
                       "--cluster", needle)
    assert not (tmp_path / "runs").exists()


def test_cluster_bound_follows_the_cores(shards, tmp_path, monkeypatch):
    from evolve.cluster import session
    monkeypatch.setattr(session.os, "cpu_count", lambda: 2)
    assert session.max_local_workers() == 8
    assert session.parse_cluster("local:8") == 8
    one_line_error(invoke("run", *TINY, "--data", shards["shards"], "--runs-dir",
                          tmp_path / "runs", "--cluster", "local:9"),
                   "--cluster", "'local:9'", "at most local:8", "2 cores")
    assert not (tmp_path / "runs").exists()


def test_tls_without_certificates_is_one_line(shards, tmp_path):
    """tls:// is accepted as an address; without TLS set up in Dask's configuration
    distributed raises TypeError while connecting: one line, exit 2."""
    one_line_error(invoke("run", *TINY, "--data", shards["shards"], "--runs-dir",
                          tmp_path / "runs", "--scheduler", "tls://127.0.0.1:1"),
                   "--scheduler", "tls://127.0.0.1:1", "cannot start or reach")
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("var", ["EVOLVE_CLUSTER_CONNECT_TIMEOUT", "EVOLVE_CLUSTER_CALL_TIMEOUT",
                                 "EVOLVE_CLUSTER_STOP_GRACE"])
@pytest.mark.parametrize("value", ["abc", "0", "-1", "nan", "inf", "1e9"])
def test_bad_limit_in_the_environment_is_one_line(shards, tmp_path, var, value):
    one_line_error(invoke("run", *TINY, "--data", shards["shards"], "--runs-dir",
                          tmp_path / "runs", "--cluster", "local:1", env={var: value}),
                   var, repr(value))
    assert not (tmp_path / "runs").exists()
