"""Run directories: everything a run leaves behind, in plain JSON and source.

    runs/<name>/
      config.json        resolved configuration, data, library versions
      history.jsonl      one JSON line per generation
      checkpoint.json    population, hall of fame and RNG state (resume)
      hall_of_fame.json  the best distinct trees on train, with valid fitness
      champion.json      the champion: expression, tree, size, depth, metrics
      champion.py        the champion as a module (same text as a write-back)
      summary.json       how the run ended (finished / interrupted / failed)

Every file is written atomically; ``history.jsonl`` is appended line by line
with fsync, and a torn last line (a crash mid-append) is ignored on load.
A run directory appears complete or not at all: it is assembled under a hidden
temporary name and renamed into place once ``config.json`` is on disk.
Loading never evaluates anything: trees are parsed against the primitive table,
and every file is size-checked and type-checked before use.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from evolve.runs import schema
from evolve.data import datasum
from evolve.io import jsonio
from evolve.io.lock import Busy, DirLock
from evolve.errors import shorten, show
from evolve.io.paths import RunError
from evolve.io.atomic import append_line, atomic_write_json, atomic_write_text, umask
import platform
from importlib.metadata import PackageNotFoundError, version

NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
RUN_FORMAT = "evolve-run"
MAX_JSON_BYTES = jsonio.MAX_JSON_BYTES


def check_name(name: str) -> str:
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise RunError.of("name", f"{name!r} is not a valid run name "
                          "(letters, digits, '.', '_', '-'; at most 64; no leading '.' or '-')")
    return name


def default_name(seed: int) -> str:
    return datetime.now().strftime("%Y%m%d-%H%M%S") + f"-s{seed}"


def versions() -> dict:
    out = {"python": platform.python_version()}
    for pkg in ("numpy", "numba", "deap", "specevolve"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    return out


def read_json(path: Path, what: str):
    """A run file: a regular file of at most MAX_JSON_BYTES, parsed by the one JSON
    reader (evolve.io.jsonio); any failure is a one-line RunError naming it."""
    return jsonio.read_json(path, what, error=RunError, limit=MAX_JSON_BYTES)


def _locked(directory: Path, shown: Path) -> DirLock:
    try:
        return DirLock(directory).acquire()
    except Busy:
        raise RunError(f"{shown}: the run is in use by another process (a live run owns "
                       "its directory); wait for it to end or stop it first") from None
    except OSError as e:
        raise RunError(f"{shown}: cannot lock the run directory ({e.strerror or e})") from None


def checked(check, *args):
    """A schema check whose failure is a RunError."""
    try:
        return check(*args)
    except schema.SchemaError as e:
        raise RunError(str(e)) from None


class RunDir:
    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.owner: DirLock | None = None     # held while this process runs the run

    # --- ownership -----------------------------------------------------
    def lock(self) -> "RunDir":
        """Own the directory for the life of this process (see evolve.io.lock)."""
        if self.owner is None:
            self.owner = _locked(self.path, self.path)
        return self

    def unlock(self) -> None:
        if self.owner is not None:
            self.owner.release()
            self.owner = None

    @property
    def name(self) -> str:
        return self.path.name

    def file(self, name: str) -> Path:
        return self.path / name

    # --- creation ------------------------------------------------------
    @classmethod
    def create(cls, parent: Path, name: str, config: dict, data: dict) -> "RunDir":
        check_name(name)
        try:
            parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise RunError.of("runs_dir", f"{parent}: cannot create it "
                              f"({e.strerror or e})") from None
        if not os.access(parent, os.W_OK):
            raise RunError.of("runs_dir", f"{parent}: not writable")
        path = parent / name
        exists = RunError(f"{path}: a run of that name exists (use --resume {name} or "
                          "another --name)")
        if os.path.lexists(path):
            raise exists
        # Assemble under a hidden name, then rename: a crash never leaves a run
        # directory without its config.json (which could be neither resumed nor reused).
        try:
            tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", suffix=".tmp", dir=parent))
        except OSError as e:
            raise RunError(f"{parent}: cannot create run directory ({e.strerror})") from None
        owner = None
        try:
            owner = _locked(tmp, path)          # owned from the moment it appears
            os.chmod(tmp, 0o777 & ~umask())   # mkdtemp makes it private
            atomic_write_json(tmp / "config.json", {
                "format": RUN_FORMAT, "version": 1, "name": name,
                "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "config": config, "data": data, "versions": versions(),
            })
            if os.path.lexists(path):
                raise exists
            os.rename(tmp, path)
        except BaseException:
            if owner is not None:
                owner.release()
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        run = cls(path)
        run.owner = owner
        return run

    @classmethod
    def open(cls, parent: Path, name_or_path: str) -> "RunDir":
        p = Path(name_or_path)
        path = p if (p.is_dir() and (os.sep in name_or_path or p.is_absolute())) else parent / name_or_path
        if not path.is_dir():
            raise RunError(f"{shorten(str(path), 200)}: no such run directory")
        if not NAME_RE.fullmatch(path.name):
            raise RunError(f"{show(path.name)} is not a valid run name (letters, digits, '.', "
                           "'_', '-'; at most 64; no leading '.' or '-')")
        run = cls(path)
        meta = run.meta()
        if meta.get("format") != RUN_FORMAT:
            raise RunError(f"{run.file('config.json')}: not an evolve run directory")
        return run

    def meta(self) -> dict:
        meta = read_json(self.file("config.json"), "run config")
        if not isinstance(meta, dict) or meta.get("format") != RUN_FORMAT:
            raise RunError(f"{self.file('config.json')}: not an evolve run config")
        if not isinstance(meta.get("config"), dict):
            raise RunError(f"{self.file('config.json')}: field 'config' is missing")
        data = meta.get("data", {})
        if not isinstance(data, dict) or not isinstance(data.get("dir", ""), str):
            raise RunError(f"{self.file('config.json')}: field 'data' is not an object "
                           "with a 'dir' string")
        if not datasum.well_formed(data.get("sha256", {})):
            raise RunError(f"{self.file('config.json')}: field 'data.sha256' is not an "
                           "object of split names and sha256 hex digests")
        return meta

    def update_config(self, config: dict) -> None:
        meta = self.meta()
        meta["config"] = config
        atomic_write_json(self.file("config.json"), meta)

    # --- history -------------------------------------------------------
    def append_history(self, record: dict) -> None:
        append_line(self.file("history.jsonl"), json.dumps(record, allow_nan=False))

    def history(self) -> list[dict]:
        """Generation records, each checked against the history schema; a torn last
        line (a crash mid-append) is ignored."""
        path = self.file("history.jsonl")
        if not os.path.lexists(path):
            return []
        raw = jsonio.read_capped(path, "history", MAX_JSON_BYTES, RunError)
        text = raw.decode("utf-8", errors="replace")
        lines = text.split("\n")
        torn = not text.endswith("\n")  # the last line was cut by a crash mid-append
        out = []
        for i, line in enumerate(lines):
            if not line.strip():
                continue
            where = f"{path}: line {i + 1}"
            try:
                rec = jsonio.loads(line, str(path), f"line {i + 1}", RunError)
            except RunError:
                if torn and i == len(lines) - 1:
                    break
                raise
            checked(schema.check_history_record, rec, where)
            out.append(rec)
        return out

    def truncate_history(self, last_generation: int) -> None:
        """Keep records up to ``last_generation`` (used when resuming a checkpoint)."""
        keep = [r for r in self.history() if r["generation"] <= last_generation]
        atomic_write_text(self.file("history.jsonl"),
                          "".join(json.dumps(r, allow_nan=False) + "\n" for r in keep))

    # --- checkpoints and results ----------------------------------------
    def write_checkpoint(self, state: dict) -> None:
        atomic_write_json(self.file("checkpoint.json"), state, compact=True)

    def checkpoint(self) -> dict:
        state = read_json(self.file("checkpoint.json"), "checkpoint")
        if not isinstance(state, dict) or state.get("format") != "evolve-checkpoint":
            raise RunError(f"{self.file('checkpoint.json')}: not an evolve checkpoint")
        for key, typ in (("generation", int), ("population", list), ("hall_of_fame", list),
                         ("random_state", list), ("config", dict)):
            if not isinstance(state.get(key), typ):
                raise RunError(f"{self.file('checkpoint.json')}: field '{key}' is missing "
                               f"or not a {typ.__name__}")
        return state

    def has_checkpoint(self) -> bool:
        return self.file("checkpoint.json").exists()

    def remove_stale_temporaries(self) -> None:
        """Delete temp files of atomic writes that a killed process left behind."""
        for p in self.path.glob(".*.tmp"):
            try:
                p.unlink()
            except OSError:
                pass

    def write_json(self, name: str, obj) -> None:
        atomic_write_json(self.file(name), obj)

    def write_text(self, name: str, text: str) -> None:
        atomic_write_text(self.file(name), text)

    def champion(self, metrics_needed: bool = True) -> dict:
        """champion.json, checked (``metrics_needed=False``: a tree is enough)."""
        path = self.file("champion.json")
        return checked(schema.check_champion, read_json(path, "champion"), str(path),
                       metrics_needed)

    def summary(self) -> dict:
        path = self.file("summary.json")
        if not os.path.lexists(path):
            return {}
        return checked(schema.check_summary, read_json(path, "summary"), str(path), self.name)

    def hall_of_fame(self) -> list | None:
        """hall_of_fame.json, checked (None before the run has finished)."""
        path = self.file("hall_of_fame.json")
        if not os.path.lexists(path):
            return None
        return checked(schema.check_hall_of_fame, read_json(path, "hall of fame"), str(path))

    def pareto(self) -> dict | None:
        path = self.file("pareto.json")
        if not os.path.lexists(path):
            return None
        return checked(schema.check_pareto, read_json(path, "trade-off data"), str(path))

    def mtime(self) -> float:
        try:
            return self.file("config.json").stat().st_mtime
        except OSError:
            return 0.0


def list_runs(parent: Path) -> list[RunDir]:
    if not parent.is_dir():
        return []
    out = []
    for p in parent.iterdir():
        # hidden names are run directories still being assembled (see RunDir.create)
        if NAME_RE.fullmatch(p.name) and p.is_dir() and (p / "config.json").is_file():
            out.append(RunDir(p))
    return sorted(out, key=lambda r: (r.mtime(), r.name))


def latest_run(parent: Path) -> RunDir:
    runs = list_runs(parent)
    if not runs:
        raise RunError(f"{parent}: no runs yet (start one with `evolve run`)")
    return runs[-1]


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
