"""The studies on a real model: SmolLM2-135M-Instruct and the draft distilled from it
(`make results-real`, docs/results/real-pair.md).

1. ``evolve data pair smollm2`` gets the pair (kept when it is there: the conversion
   and the draft are built once);
2. the TV world: traces of its instruction prompts, sampled at temperature 1
   (``evolve data trace --backend hf``, 240 / 120 / 120 prompts, 16 blocks of 4),
   then ``benchmarks.experiments.trace_results`` on them: a champion evolved per TV
   budget (multi-start; the spread over starts is reported), every rule family tuned
   on valid, everything on test exactly, and the champions against the best tuned
   baseline decoded free-running with the two models, paired;
3. the lookahead inputs and the learned value gates on the same traces: a champion
   that may read ``next_tv`` and ``ahead`` evolved per TV budget (``trace_results
   --variants lookahead``; free-running, a rule that reads them has its TV estimated at
   the pair's reached slots), and the two value gates against per-position leniency
   (``benchmarks.experiments.value_gate``), free-running once per seed of the uniforms;
4. the task world, judged per answer: the capitals task recorded greedy and sampled
   with critical-token labels (``evolve data task --answer-words``), then
   ``benchmarks.experiments.task_results`` on them: a champion evolved per accuracy
   budget, chosen free-running on valid, and ``evolve tradeoff`` (the rules of
   ``FAMILIES`` tuned on valid free-running to the fewest target calls per correct
   answer, decoded paired on test);
5. the headroom: the answer oracle against lossless decoding on the same test problems
   (``benchmarks.experiments.real_oracle``), each tuned rule's share of its saving;
6. whether a judge reaches it: logistic judges taught critical tokens or the oracle's
   own decisions, tuned on valid free-running and decoded on test beside the oracle
   (``benchmarks.experiments.oracle_judge --data``, greedy decoding).

Each step keeps what an earlier run left (the traces, the task recordings, finished
searches with ``--reuse-runs``), and the task world's results of a decoding not run this
time (``--modes``) are kept in its figures. Every step's settings and time go to a ledger,
``results/steps.json`` in the pair's folder; with ``--resume`` (``make results-real``) a
step the ledger holds as finished with the same settings is not run again, so a run cut
off continues where it stopped. The ledger also keeps the time of attempts cut off and
done again, so the command's time is known however many sittings it took. The figures go to
``benchmarks/experiments/real_trace_results.json`` and ``real_task_results.json``;
``--page`` writes their sections of docs/results/real-pair.md and its picture.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path

from benchmarks.common import ROOT  # noqa: E402

from benchmarks.experiments.trace_results import _shown  # noqa: E402
from evolve.io import paths  # noqa: E402

PAIR = paths.DATA_DIR / "pairs" / "smollm2"
EXP = ROOT / "benchmarks" / "experiments"
KIND = "capitals"
# problems of the task's train, valid and test splits (the task file's first of each)
TASK_SIZES = (16, 8, 16)
MODES = ("greedy", "sample")
STEPS = ("traces", "lookahead", "value-gate", "task", "oracle", "oracle-judge")
# the rules the task world's trade-off tunes here: every candidate costs a free-running
# decoding of valid per grid value with the two models (minutes each on 2 cores), so the
# published lossy rules of each decoding (those of another decoding are left out there)
# and the learned judge, not the whole table
FAMILIES = ("fuzzy_sd", "trtllm_relaxed", "kl_judge", "fly", "typical_acceptance",
            "learned_judge")


class Ledger:
    """Each finished step of results-real, its settings and its seconds, in a JSON file.

    While a step runs, its elapsed time is written every ``beat`` seconds under
    ``running``; a process cut off leaves it there, and the next ledger opened on the
    file moves it to ``interrupted``, so time spent on work done again is not lost."""

    def __init__(self, path: Path, beat: float = 30.0):
        self.path, self.beat, self._lock = Path(path), beat, threading.Lock()
        self.d = _load(self.path) if self.path.exists() else {}
        self.d.setdefault("steps", {})
        self.d.setdefault("interrupted", [])
        cut = self.d.pop("running", None)
        if cut is not None:
            self.d["interrupted"].append(cut)
            self._save()

    def _save(self) -> None:
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(self.path.name + ".tmp")
            tmp.write_text(json.dumps(self.d, indent=1) + "\n")
            os.replace(tmp, self.path)

    def finished(self, step: str, settings: dict, page: bool = False) -> bool:
        """The step ran to its end with these settings (and wrote its page section when
        the page is asked for)."""
        e = self.d["steps"].get(step)
        return e is not None and e["settings"] == settings and (e["page"] or not page)

    def forget(self, *steps: str) -> None:
        for step in steps:
            self.d["steps"].pop(step, None)
        self._save()

    @contextmanager
    def step(self, step: str, settings: dict | None = None, page: bool = False):
        """Time the body as ``step``; recorded as finished only when the body returns."""
        t0 = time.time()
        stop = threading.Event()

        def running():
            self.d["running"] = {"step": step, "seconds": round(time.time() - t0, 1)}
            self._save()

        def beat():
            while not stop.wait(self.beat):
                running()

        running()
        th = threading.Thread(target=beat, daemon=True)
        th.start()
        try:
            yield
        except BaseException:
            stop.set()
            th.join()
            self.d["interrupted"].append(self.d.pop("running"))
            self.d["interrupted"][-1]["seconds"] = round(time.time() - t0, 1)
            self._save()
            raise
        stop.set()
        th.join()
        self.d.pop("running")
        self.d["steps"][step] = {"settings": settings or {}, "page": page,
                                 "seconds": round(time.time() - t0, 1),
                                 "finished": time.strftime("%Y-%m-%d %H:%M:%S")}
        self._save()

    @classmethod
    def read(cls, path: Path) -> "Ledger":
        """The ledger as it is on disk (a step running now stays ``running``)."""
        led = cls.__new__(cls)
        led.path, led._lock = Path(path), threading.Lock()
        if not led.path.exists():
            raise SystemExit(f"{path}: no ledger (results-real has not run on this pair)")
        led.d = _load(led.path)
        return led

    def table(self) -> str:
        """The steps in the order they finished, their minutes and the totals."""
        rows = [f"{'step':<20} {'minutes':>8}  finished"]
        for step, e in sorted(self.d["steps"].items(), key=lambda kv: kv[1]["finished"]):
            rows.append(f"{step:<20} {e['seconds'] / 60:>8.1f}  {e['finished']}")
        done, cut = self.minutes()
        rows.append(f"{'finished steps':<20} {done:>8.1f}")
        rows.append(f"{'cut off, done again':<20} {cut:>8.1f}  "
                    f"({len(self.d['interrupted'])} attempts)")
        if "running" in self.d:
            r = self.d["running"]
            rows.append(f"{'running now':<20} {r['seconds'] / 60:>8.1f}  {r['step']} "
                        "(or cut off, if no run is under way)")
        return "\n".join(rows)

    def minutes(self) -> tuple[float, float]:
        """Minutes of the steps' finished attempts, and of attempts cut off."""
        return (sum(e["seconds"] for e in self.d["steps"].values()) / 60,
                sum(e["seconds"] for e in self.d["interrupted"]) / 60)


def _load(path: Path) -> dict:
    """A ledger's contents, or a one-line error naming the file."""
    try:
        d = json.loads(path.read_text())
        if not isinstance(d, dict) or not isinstance(d.get("steps", {}), dict) or \
                not isinstance(d.get("interrupted", []), list):
            raise ValueError("its steps are not a mapping or its cut-off attempts not a list")
        for step, e in d.get("steps", {}).items():
            missing = {"seconds", "settings", "page", "finished"} - set(e)
            if missing:
                raise KeyError(f"step {step!r} lacks {', '.join(sorted(missing))}")
            float(e["seconds"])
        return d
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SystemExit(f"{path}: not a results-real ledger ({type(e).__name__}: {e}); "
                         "remove it to run every step again") from None


def _evolve(*args) -> None:
    """``evolve ARGS`` in a process of its own (the command a user would type)."""
    cmd = [sys.executable, "-c", "from evolve.cli import main; main()", *map(str, args)]
    print("$ evolve " + " ".join(map(str, args)), file=sys.stderr, flush=True)
    subprocess.run(cmd, check=True, cwd=ROOT)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", type=Path, default=PAIR, help="the pair's folder")
    ap.add_argument("--modes", nargs="*", choices=MODES, default=list(MODES),
                    help="the task world's decodings [greedy sample]")
    ap.add_argument("--skip", nargs="*", choices=STEPS, default=[],
                    help="leave out steps: the TV world (traces), its lookahead and value-gate "
                         "studies, the task world (task), the answer oracle (oracle), the "
                         "judges taught its decisions (oracle-judge)")
    ap.add_argument("--starts", type=int, default=5)
    ap.add_argument("--prompts", type=int, default=48,
                    help="test prompts decoded free-running in the TV world [48]")
    ap.add_argument("--lookahead-slots", type=int, default=100,
                    help="reached slots at which the free-running TV of a rule that reads a "
                         "lookahead input is estimated (about 3 s each on 2 cores) [100]")
    ap.add_argument("--reuse-runs", action="store_true",
                    help="keep finished task-world searches of the same name")
    ap.add_argument("--resume", action="store_true",
                    help="leave out the steps the ledger (results/steps.json in the pair's "
                         "folder) holds as finished with the same settings, and keep finished "
                         "task-world searches (--reuse-runs)")
    ap.add_argument("--page", action="store_true",
                    help="write the sections of docs/results/real-pair.md and its picture")
    ap.add_argument("--times", action="store_true",
                    help="print the ledger's steps and times, and run nothing")
    a = ap.parse_args(argv)
    if a.times:
        print(Ledger.read(a.pair / "results" / "steps.json").table())
        return 0
    t0 = time.perf_counter()
    P = a.pair
    reuse = a.reuse_runs or a.resume
    built = not (P / "draft").exists()
    ledger = Ledger(P / "results" / "steps.json")
    with ledger.step("pair") if built else nullcontext():
        _evolve("data", "pair", "smollm2", "--out", P)
    if built:
        ledger.forget(*STEPS)
    page = ["--page"] if a.page else []
    traces = P / "results" / "traces"

    def todo(step: str, settings: dict) -> bool:
        if step in a.skip:
            return False
        if a.resume and ledger.finished(step, settings, a.page):
            print(f"results-real: {step} finished before with these settings; kept",
                  file=sys.stderr)
            return False
        return True

    if not {"traces", "lookahead", "value-gate"} <= set(a.skip) and \
            not (traces / "test.npz").exists():
        with ledger.step("record-traces"):
            _evolve("data", "trace", "--backend", "hf", "--target", P / "target", "--draft",
                    P / "draft", "--prompts", P / "prompts.jsonl", "--out", traces)
        ledger.forget("traces", "lookahead", "value-gate")
    from benchmarks.experiments import trace_results, value_gate
    tv = {"starts": a.starts, "prompts": a.prompts, "lookahead_slots": a.lookahead_slots}
    for step, variants, name in (("traces", ("plain", "p99"), "real-trace-results"),
                                 ("lookahead", ("lookahead",), "real-lookahead-results")):
        if todo(step, tv):
            with ledger.step(step, tv, a.page):
                trace_results.main(["--data", _shown(traces), "--starts", str(a.starts),
                                    "--population", "300", "--generations", "30",
                                    "--variants", *variants, "--prompts", str(a.prompts),
                                    "--lookahead-slots", str(a.lookahead_slots),
                                    "--out", _shown(EXP / f"{name.replace('-', '_')}.json"),
                                    "--runs-dir", _shown(paths.RUNS_DIR / name),
                                    "--section", name, *page])
    gate = {"prompts": a.prompts, "lookahead_slots": a.lookahead_slots}
    if todo("value-gate", gate):
        with ledger.step("value-gate", gate, a.page):
            value_gate.main(["--data", _shown(traces), "--prompts", str(a.prompts),
                             "--lookahead-slots", str(a.lookahead_slots),
                             "--out", _shown(EXP / "real_value_gate.json"),
                             "--section", "real-value-gate", *page])
    task = P / "results" / "task"
    if "task" not in a.skip and a.modes:
        for mode in a.modes:
            if not (task / mode / "test.npz").exists():
                with ledger.step(f"record-task-{mode}"):
                    _evolve("data", "task", "--task-file", P / "tasks" / f"{KIND}.jsonl",
                            "--target", P / "target", "--draft", P / "draft",
                            "--answer-words", "--max-new-tokens", 48, "--decoding", mode,
                            "--train-prompts", TASK_SIZES[0], "--valid-prompts",
                            TASK_SIZES[1], "--test-prompts", TASK_SIZES[2],
                            "--out", task / mode,
                            *(["--resume"] if (task / mode).exists() else []))
                ledger.forget("task", "oracle", "oracle-judge")
    modes = {"modes": sorted(a.modes), "starts": a.starts}
    if a.modes and todo("task", modes):
        from benchmarks.experiments import task_results
        with ledger.step("task", modes, a.page):
            task_results.main(["--data", _shown(task), "--modes", *a.modes, "--budgets",
                               "0.01", "--oracle-prompts", "0", "--starts", str(a.starts),
                               "--population", "200", "--generations", "20", "--jobs", "1",
                               "--families", *FAMILIES,
                               "--out", _shown(EXP / "real_task_results.json"),
                               "--runs-dir", _shown(paths.RUNS_DIR / "real-task-results"),
                               "--section", "real-task-results", "--merge",
                               "--picture",
                               _shown(ROOT / "docs" / "img" / "real_task_results.png"),
                               *(["--reuse-runs"] if reuse else []), *page])
    if a.modes and todo("oracle", {"modes": sorted(a.modes)}):
        from benchmarks.experiments import real_oracle
        with ledger.step("oracle", {"modes": sorted(a.modes)}, a.page):
            real_oracle.main(["--data", _shown(task), "--modes", *a.modes, *page])
    if "greedy" in a.modes and todo("oracle-judge", {}):
        from benchmarks.experiments import oracle_judge
        with ledger.step("oracle-judge", {}, a.page):
            oracle_judge.main(["--data", _shown(task / "greedy"),
                               "--valid", str(TASK_SIZES[1]), "--test", str(TASK_SIZES[2]),
                               "--out", _shown(EXP / "real_oracle_judge.json"),
                               "--section", "real-oracle-judge", *page])
    done, cut = ledger.minutes()
    print(f"results-real: {(time.perf_counter() - t0) / 60:.0f} minutes this run; the "
          f"ledger's steps {done:.0f} minutes, and {cut:.0f} minutes of attempts cut off "
          f"and done again ({_shown(ledger.path)})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
