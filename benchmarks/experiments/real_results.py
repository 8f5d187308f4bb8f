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
searches with ``--reuse-runs``), so an interrupted run continues, and the task world's
results of a decoding not run this time (``--modes``) are kept in its figures. The figures go to
``benchmarks/experiments/real_trace_results.json`` and ``real_task_results.json``;
``--page`` writes their sections of docs/results/real-pair.md and its picture.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
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
    ap.add_argument("--page", action="store_true",
                    help="write the sections of docs/results/real-pair.md and its picture")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    P = a.pair
    _evolve("data", "pair", "smollm2", "--out", P)
    page = ["--page"] if a.page else []
    traces = P / "results" / "traces"
    if not {"traces", "lookahead", "value-gate"} <= set(a.skip) and \
            not (traces / "test.npz").exists():
        _evolve("data", "trace", "--backend", "hf", "--target", P / "target", "--draft",
                P / "draft", "--prompts", P / "prompts.jsonl", "--out", traces)
    from benchmarks.experiments import trace_results, value_gate
    for step, variants, name in (("traces", ("plain", "p99"), "real-trace-results"),
                                 ("lookahead", ("lookahead",), "real-lookahead-results")):
        if step not in a.skip:
            trace_results.main(["--data", _shown(traces), "--starts", str(a.starts),
                                "--population", "300", "--generations", "30",
                                "--variants", *variants, "--prompts", str(a.prompts),
                                "--lookahead-slots", str(a.lookahead_slots),
                                "--out", _shown(EXP / f"{name.replace('-', '_')}.json"),
                                "--runs-dir", _shown(paths.RUNS_DIR / name),
                                "--section", name, *page])
    if "value-gate" not in a.skip:
        value_gate.main(["--data", _shown(traces), "--prompts", str(a.prompts),
                         "--lookahead-slots", str(a.lookahead_slots),
                         "--out", _shown(EXP / "real_value_gate.json"),
                         "--section", "real-value-gate", *page])
    if "task" not in a.skip and a.modes:
        task = P / "results" / "task"
        for mode in a.modes:
            if not (task / mode / "test.npz").exists():
                _evolve("data", "task", "--task-file", P / "tasks" / f"{KIND}.jsonl",
                        "--target", P / "target", "--draft", P / "draft", "--answer-words",
                        "--max-new-tokens", 48, "--decoding", mode,
                        "--train-prompts", TASK_SIZES[0], "--valid-prompts", TASK_SIZES[1],
                        "--test-prompts", TASK_SIZES[2], "--out", task / mode,
                        *(["--resume"] if (task / mode).exists() else []))
        from benchmarks.experiments import task_results
        task_results.main(["--data", _shown(task), "--modes", *a.modes, "--budgets", "0.01",
                           "--oracle-prompts", "0", "--starts", str(a.starts),
                           "--population", "200", "--generations", "20", "--jobs", "1",
                           "--families", *FAMILIES,
                           "--out", _shown(EXP / "real_task_results.json"),
                           "--runs-dir", _shown(paths.RUNS_DIR / "real-task-results"),
                           "--section", "real-task-results", "--merge",
                           "--picture", _shown(ROOT / "docs" / "img" / "real_task_results.png"),
                           *(["--reuse-runs"] if a.reuse_runs else []), *page])
    if "oracle" not in a.skip and a.modes:
        from benchmarks.experiments import real_oracle
        real_oracle.main(["--data", _shown(P / "results" / "task"), "--modes", *a.modes, *page])
    if "oracle-judge" not in a.skip and "greedy" in a.modes:
        from benchmarks.experiments import oracle_judge
        oracle_judge.main(["--data", _shown(P / "results" / "task" / "greedy"),
                           "--valid", str(TASK_SIZES[1]), "--test", str(TASK_SIZES[2]),
                           "--out", _shown(EXP / "real_oracle_judge.json"),
                           "--section", "real-oracle-judge", *page])
    print(f"results-real: {(time.perf_counter() - t0) / 60:.0f} minutes", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
