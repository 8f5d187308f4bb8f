"""Schemas of the run files read back by ``inspect``, ``runs``, ``simulate`` and resume.

Every file is checked on read against what the run writes: types, finite
numbers within bounds, known status values, and a resume command that is
exactly one the run could have printed. A file that does not fit raises a
one-line SchemaError naming the file (and line), the field and the value (the
run directory's readers turn it into a RunError).
(Checkpoints and configs have their own checks: evolve.search.checkpoint and
evolve.search.config.)
"""

from __future__ import annotations

import math
import shlex

from evolve.errors import EvolveError, show
from evolve.standing import VERDICTS


class SchemaError(EvolveError):
    """A run file that does not fit its schema; one line naming file and field."""

BOUND = 1e12            # no number a run writes comes near it; plots stay finite
STATUSES = ("finished", "interrupted", "failed")
HISTORY_NUMBERS = ("best_train", "best_valid", "mean_size")
RESUME_FLAGS = ("--no-writeback", "--force")
RESUME_OPTIONS = ("--cluster", "--scheduler", "--device")     # each with a value
MAX_RESUME_CHARS = 4096


def is_number(x, bound: float = BOUND) -> bool:
    return (isinstance(x, (int, float)) and not isinstance(x, bool)
            and math.isfinite(x) and abs(x) <= bound)


def is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _need(ok: bool, where: str, field: str, value, expected: str) -> None:
    if not ok:
        raise SchemaError(f"{where}: field '{field}' is {show(value)}; expected {expected}")


def _object(doc, where: str, what: str) -> dict:
    if not isinstance(doc, dict):
        raise SchemaError(f"{where}: {what} must be a JSON object, got {type(doc).__name__}")
    return doc


def check_history_record(rec, where: str) -> dict:
    """One ``history.jsonl`` line (``where`` names the file and line)."""
    _object(rec, where, "a generation record")
    g = rec.get("generation")
    _need(is_int(g) and g >= 0, where, "generation", g, "a whole number >= 0")
    for key in HISTORY_NUMBERS:
        _need(is_number(rec.get(key)), where, key, rec.get(key), "a finite number")
    for key in ("median_train",):
        if key in rec:
            _need(is_number(rec[key]), where, key, rec[key], "a finite number")
    return rec


def check_summary(doc, where: str, run_name: str) -> dict:
    """``summary.json``: how the run ended."""
    _object(doc, where, "the summary")
    status = doc.get("status")
    _need(status in STATUSES, where, "status", status, " / ".join(STATUSES))
    g = doc.get("generation")
    _need(g is None or (is_int(g) and g >= 0), where, "generation", g, "a whole number >= 0")
    for key in ("signal", "ended", "error", "pareto_png"):
        if doc.get(key) is not None:
            _need(isinstance(doc[key], str), where, key, doc[key], "a string")
    wb = doc.get("writeback")
    _need(wb is None or isinstance(wb, dict), where, "writeback", wb, "an object or null")
    if doc.get("resume") is not None:
        check_resume_command(doc["resume"], where, run_name)
    return doc


def check_resume_command(cmd, where: str, run_name: str) -> str:
    """A resume command is one ``runner.resume_command`` prints for this run:
    ``evolve run --resume NAME``, then ``--runs-dir DIR``, then the ``RESUME_FLAGS``
    and the ``RESUME_OPTIONS`` with their values, each at most once; at most
    ``MAX_RESUME_CHARS`` characters (a run checks its own at the start)."""
    expected = ("`evolve run --resume NAME [--runs-dir DIR] [--no-writeback] [--force] "
                "[--cluster local:N] [--scheduler ADDRESS] [--device cuda]` of at most "
                f"{MAX_RESUME_CHARS} characters")
    _need(isinstance(cmd, str) and len(cmd) <= MAX_RESUME_CHARS, where, "resume", cmd,
          expected)
    try:
        parts = shlex.split(cmd)
    except ValueError:
        parts = []
    ok = parts[:4] == ["evolve", "run", "--resume", run_name]
    rest = parts[4:]
    if ok and rest[:1] == ["--runs-dir"]:
        ok = len(rest) >= 2 and bool(rest[1])
        rest = rest[2:]
    seen = set()
    while ok and rest:
        word = rest.pop(0)
        ok = word in RESUME_FLAGS + RESUME_OPTIONS and word not in seen
        seen.add(word)
        if ok and word in RESUME_OPTIONS:
            ok = bool(rest) and bool(rest.pop(0))
    ok = ok and shlex.join(parts) == cmd
    _need(ok, where, "resume", cmd, expected)
    return cmd


def _check_metrics(m, where: str, field: str, keys) -> None:
    _need(isinstance(m, dict), where, field, m, "an object of metrics")
    for key in keys:
        _need(is_number(m.get(key)), where, f"{field}.{key}", m.get(key), "a finite number")


def check_champion(doc, where: str, metrics_needed: bool = True) -> dict:
    """``champion.json``: the tree (parsed by the caller) and metrics per split
    (valid and test at least; only the tree when ``metrics_needed`` is false)."""
    _object(doc, where, "the champion")
    _need(isinstance(doc.get("tree"), str), where, "tree", doc.get("tree"), "a string")
    metrics = doc.get("metrics")
    if metrics is None and not metrics_needed:
        return doc
    _need(isinstance(metrics, dict) and {"valid", "test"} <= set(metrics), where, "metrics",
          metrics if not isinstance(metrics, dict) else sorted(metrics),
          "an object of splits with valid and test")
    keys = champion_metric_keys(doc)
    for split, m in metrics.items():
        _need(isinstance(split, str) and len(split) <= 64, where, "metrics", split, "a split")
        _check_metrics(m, where, f"metrics.{split}", keys)
    g = doc.get("generation")
    _need(g is None or (is_int(g) and g >= 0), where, "generation", g, "a whole number >= 0")
    from evolve.objectives import SETTINGS    # lazy: start-up (numpy)
    for setting in SETTINGS:          # what the objectives record (evolve.objectives)
        if setting.meta is not None:
            value = doc.get(setting.meta)
            _need(value is None or (isinstance(value, bool) if setting.kind == "bool"
                                    else is_number(value)), where, setting.meta, value,
                  "True or False" if setting.kind == "bool" else "a finite number")
    if "baselines_tuned_on_valid" in doc:
        tuned_keys = champion_task(doc).tuned_metric_keys
        tuned = doc.get("baselines_tuned_on_valid") or {}
        _need(isinstance(tuned, dict), where, "baselines_tuned_on_valid", tuned, "an object")
        note = doc.get("estimate")
        _need(note is None or (isinstance(note, str) and len(note) <= 1000), where,
              "estimate", note, "a string of at most 1000 characters")
        for name, rep in tuned.items():
            field = f"baselines_tuned_on_valid.{name}"
            if rep is None:
                continue
            _need(isinstance(rep, dict), where, field, rep, "an object or null")
            _need(rep.get("param") is None or is_number(rep["param"]), where,
                  f"{field}.param", rep.get("param"), "a finite number or null")
            for split in ("valid", "test"):
                _check_metrics(rep.get(split), where, f"{field}.{split}", tuned_keys)
    if "scope" in doc:
        check_scope(doc["scope"], where)
    st = doc.get("standing")
    if st is not None:
        _need(isinstance(st, dict) and st.get("verdict") in VERDICTS
              and isinstance(st.get("why"), str) and len(st["why"]) <= 1000, where,
              "standing", st, f"an object with verdict ({', '.join(VERDICTS)}) and why")
    return doc


MAX_VOCAB = 1 << 24


def check_scope(sc, where: str) -> dict:
    """A trace champion's ``scope`` (``evolve.data.traces.scope_of``): what its exports
    write into code, so every value is checked (whole numbers in range, a finite
    positive temperature or null)."""
    _need(isinstance(sc, dict), where, "scope", sc, "an object")
    V = sc.get("vocab_size")
    _need(is_int(V) and 1 <= V <= MAX_VOCAB, where, "scope.vocab_size", V,
          f"a whole number 1..{MAX_VOCAB}")
    k = sc.get("top_k")
    _need(k is None or (is_int(k) and 1 <= k < V), where, "scope.top_k", k,
          "null (every token) or a whole number 1..vocab_size-1")
    g = sc.get("block_size")
    _need(is_int(g) and 1 <= g <= 1024, where, "scope.block_size", g, "a whole number 1..1024")
    t = sc.get("temperature")
    _need(t is None or (is_number(t) and t > 0), where, "scope.temperature", t,
          "a finite number > 0 or null")
    _need(sc.get("truncation") is None, where, "scope.truncation", sc.get("truncation"),
          "null (no top-k or top-p truncation)")
    d = sc.get("decoding", "sample")
    _need(d in ("sample", "greedy"), where, "scope.decoding", d, "sample or greedy")
    _need(d != "greedy" or k is None, where, "scope.top_k", k,
          "null in greedy decoding (the rule decides every draft that is not the target's "
          "argmax)")
    return sc


def champion_task(doc: dict):
    """The task (``evolve.tasks``) of this champion, by its objective."""
    from evolve.tasks import champion_task as task    # lazy: start-up (Numba, NumPy)
    return task(doc)


def champion_metric_keys(doc: dict) -> tuple:
    """The metrics every split of this champion holds (its objective's task's)."""
    return champion_task(doc).metric_keys


def check_pareto(doc, where: str) -> dict:
    """``pareto.json``: the budget and named series of (TV per token, tokens per call)."""
    _object(doc, where, "the trade-off data")
    budget = doc.get("budget")
    _need(is_number(budget) and budget >= 0, where, "budget", budget, "a finite number >= 0")
    series = doc.get("series")
    _need(isinstance(series, dict), where, "series", series, "an object of point lists")
    for name, pts in series.items():
        ok = isinstance(pts, list) and all(
            isinstance(p, list) and len(p) == 2 and all(is_number(v, 1e6) for v in p)
            for p in pts)
        _need(ok, where, f"series.{name}", pts if not isinstance(pts, list) else pts[:2],
              "a list of [x, y] finite numbers within 1e6")
    return doc


HOF_NUMBERS = ("train_fitness", "valid_fitness")
HOF_VALID = ("tokens_per_call", "tv_per_token")      # pareto.json's, on traces


def check_hall_of_fame(doc, where: str) -> list:
    """``hall_of_fame.json``: the best distinct trees on train, each with its tree text,
    formula, size, generation born and train and valid fitness."""
    _need(isinstance(doc, list), where, "hall of fame", type(doc).__name__,
          "a list of entries")
    for i, e in enumerate(doc):
        _object(e, where, f"entry {i}")
        for key in ("tree", "expression"):
            _need(isinstance(e.get(key), str), where, f"{i}.{key}", e.get(key), "a string")
        for key in ("size", "born"):
            _need(is_int(e.get(key)) and e[key] >= 0, where, f"{i}.{key}", e.get(key),
                  "a whole number >= 0")
        for key in HOF_NUMBERS:
            _need(is_number(e.get(key)), where, f"{i}.{key}", e.get(key), "a finite number")
    return doc


def check_pareto_hall_of_fame(doc: dict, where: str) -> list:
    """The ``hall_of_fame`` of ``pareto.json`` (a trace run's: tree, tokens per call and
    TV per token on valid); an empty list when it has none."""
    hof = doc.get("hall_of_fame", [])
    _need(isinstance(hof, list), where, "hall_of_fame", type(hof).__name__, "a list")
    for i, e in enumerate(hof):
        _object(e, where, f"hall_of_fame entry {i}")
        _need(isinstance(e.get("tree"), str), where, f"hall_of_fame.{i}.tree", e.get("tree"),
              "a string")
        for key in HOF_VALID:
            _need(is_number(e.get(key)), where, f"hall_of_fame.{i}.{key}", e.get(key),
                  "a finite number")
    return hof
