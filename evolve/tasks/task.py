"""Tasks with checked answers (datasets/task/): traces with critical-token labels.

Splits are ``evolve.data.sources.task.record`` TaskSplits (traces of a task decoded
by the standard rule, greedy or sampled, and a label per draft the standard rule
could reject); champions are scored by the task objectives
(``evolve.objectives.task_objectives``), reported beside every rule family tuned to
the run's critical budget on valid (``evolve.rules.task_tuning``), and judged by
task accuracy free-running (``evolve.freerun.task_compare``). A champion is not written back:
export it from its run (its scope records the decoding: a greedy champion exports to
numpy and torch, whose ``acceptance`` keeps the target's argmax drafts).
"""

from __future__ import annotations

from pathlib import Path

from evolve.cluster.session import Session
from evolve.data import shards, traces
from evolve.data.sources.task import record
from evolve.data.tokens import DataError
from evolve.io.paths import DATA_DIR
from evolve.objectives import bind
from evolve.objectives.task_data import task_data
from evolve.rules import task_tuning
from evolve.standing import INFEASIBLE, LOSES, WINS
from evolve.tasks.base import Task

TASK_DIR = DATA_DIR / "task"
HEADER_KEYS = ("tokens_per_call", "critical_per_answer")


class TaskTask(Task):
    name = "task"
    trace_inputs = True
    figure = "tokens_per_call"
    header_keys = HEADER_KEYS
    metric_keys = ("tokens_per_call", "critical_per_answer", "critical_per_token",
                   "false_rejects_per_token", "accept_rate", "fitness")
    tuned_metric_keys = ("tokens_per_call", "critical_per_answer", "critical_per_token")

    def default_data(self) -> Path:
        return TASK_DIR

    def load_splits(self, config, data_dir: Path, session=None) -> dict:
        session = session or Session()
        if shards.is_sharded(data_dir):
            splits = shards.load_splits(data_dir)
            for name, sp in splits.items():
                if "labels" not in sp.meta:
                    raise DataError(f"{shards.shown(sp.directory / shards.MANIFEST)}: field "
                                    "'meta.labels' is missing: these shards hold no critical-"
                                    "token labels (shard what `evolve data task` recorded)")
            return session.attach(splits)
        session.attach({})             # --cluster without shards: one line, before anything
        if not Path(data_dir).is_dir():
            raise DataError(f"{data_dir}: no task traces (record them with `evolve data task`)")
        return {s: record.load(data_dir, s) for s in ("train", "valid", "test")}

    def select(self, result, say=None) -> dict | None:
        """The champion chosen free-running on valid (``evolve.freerun.select``) when
        the run's ``select_problems`` is above 0: by target calls per correct answer,
        within the critical budget taken as an accuracy drop. A pair that cannot be
        rebuilt (its models are gone) leaves the choice on the recorded path, and the
        record says why."""
        cfg = result.config
        problems = int(getattr(cfg, "select_problems", 0) or 0)
        if problems <= 0:
            return None
        from evolve.data.sources.task import pair as TP     # lazy: the decoder on use
        from evolve.errors import EvolveError              # lazy: as above
        from evolve.freerun import select                  # lazy: as above
        meta = result.splits["valid"].meta
        try:
            pair = TP.rebuild(meta)
        except (KeyError, TypeError, ValueError, EvolveError) as e:
            return {"skipped": f"the pair that recorded these traces cannot be rebuilt "
                               f"({str(e).splitlines()[0] if str(e) else type(e).__name__})"}
        (say or (lambda text: None))(
            f"choosing the champion free-running on {problems} valid problems ...")
        agree = getattr(cfg, "agreement_budget", 1.0)
        return select.select(pair, result.hof_trees, cfg.critical_budget,
                             meta["decoding"] == "greedy", problems, say,
                             agreement_budget=None if agree >= 1.0 else agree)

    def report(self, result) -> dict:
        """The rule families tuned on valid to the run's critical budget (reported on
        test), and where the champion stands against them and the standard rule."""
        cfg, metrics = result.config, result.metrics
        objective = bind(cfg)
        tds = {k: (result.evaluators[k].arrays if k in result.evaluators
                   else task_data(result.splits[k])).whole() for k in ("train", "valid", "test")}
        tuned = task_tuning.tuned_all(tds, cfg.critical_budget)
        std = tuned[task_tuning.STANDARD]["valid"]
        score = objective.split_score(metrics["valid"], cfg)
        best = max(((k, v) for k, v in tuned.items() if v is not None),
                   key=lambda kv: kv[1]["valid"]["tokens_per_call"], default=None)
        if score < 1.0:
            verdict, why = INFEASIBLE, (f"over the run's budget on valid (critical per "
                                          f"answer {metrics['valid']['critical_per_answer']:.5f}"
                                          f" > {cfg.critical_budget:g})")
        elif score < std["tokens_per_call"]:
            verdict, why = INFEASIBLE, (f"below the lossless rule on valid ({score:.4f} vs "
                                          f"{std['tokens_per_call']:.4f} tokens per call)")
        elif best is not None and best[1]["valid"]["tokens_per_call"] > score:
            verdict, why = LOSES, (f"{best[0]}, tuned to the same budget, decodes more on "
                                     f"valid ({best[1]['valid']['tokens_per_call']:.4f} vs "
                                     f"{score:.4f} tokens per call)")
        else:
            verdict, why = WINS, (f"beats the lossless rule and every rule family tuned "
                                    f"to critical {cfg.critical_budget:g} on valid "
                                    f"({score:.4f} tokens per call)")
        sel = result.selection
        recorded = {"verdict": verdict, "why": why}
        if sel is not None and "tree" in sel:
            verdict, why = freerun_verdict(sel)
        elif sel is not None:
            why += f"; on the recorded path only: {sel['skipped']}"
        champion = {"baselines_tuned_on_valid": tuned,
                    "decoding": result.splits["valid"].meta["decoding"],
                    "scope": traces.scope_of(result.splits["valid"].meta),
                    "standing": {"verdict": verdict, "why": why, "valid_score": score,
                                 "standard_rejection": std["tokens_per_call"],
                                 "best_tuned": None if best is None else
                                 {"rule": best[0], "param": best[1]["param"],
                                  "tokens_per_call": best[1]["valid"]["tokens_per_call"]},
                                 **({"recorded_path": recorded} if sel and "tree" in sel
                                    else {})}}
        return {"champion": champion, "files": {}}

    def runs_text(self, row: dict, split: str) -> str:
        return (f"{row[f'{split}_tokens_per_call']:.3f} tok/call, "
                f"critical/answer {row[f'{split}_critical_per_answer']:.4f}")


def freerun_verdict(sel: dict) -> tuple[str, str]:
    """(verdict, why) of a champion chosen free-running (``evolve.freerun.select``): it
    wins when it takes fewer target calls per correct answer than the lossless rule on
    the same valid problems, within the budget; where the choice is the lossless rule,
    no rule of the hall of fame nor any step towards one did."""
    n, b, ls, s = sel["problems"], sel["budget"], sel["lossless"], sel["valid"]
    where = f"free-running on {n} valid problems ({sel['decoding']})"
    ab = sel.get("agreement_budget")
    within = f"an accuracy drop of {b:g}" + (
        "" if ab is None else f" and at most {ab:g} of the answers changed")

    def calls(x):
        return "no right answer" if x is None else f"{x:.2f}"
    if sel["source"] is None:
        return LOSES, (f"{where}, no rule of the hall of fame, nor any step from lossless "
                       f"towards one, takes fewer target calls per correct answer than the "
                       f"lossless rule ({calls(ls['calls_per_correct'])}) within {within}: "
                       f"the champion is the lossless rule")
    return WINS, (f"{where}: {calls(s['calls_per_correct'])} target calls per correct answer "
                  f"vs the lossless rule's {calls(ls['calls_per_correct'])}, accuracy drop "
                  f"{sel['drop']:+.3f} within {b:g}"
                  + ("" if ab is None else f", agreement with lossless {s['agreement']:.3f}"
                     f" (at least {1 - ab:.3g})")
                  + f" (hall-of-fame rule {sel['source'] + 1}, "
                  f"{sel['alpha']:g} of the way from lossless)")

