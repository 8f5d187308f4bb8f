"""The headroom any judge has on the real pair: the answer oracle against lossless decoding.

The answer oracle (``evolve.rules.oracle``) keeps exactly the drafts the lossless rule
could reject whose continuation keeps the answer (and does not lengthen it), decoding
free-running with the two models; it is the most a per-token judge could save. This
decodes the first ``--problems`` test problems of each recording with the lossless rule
and with the oracle (the same problems and uniforms), and sets beside the oracle's
saving the saving of each rule tuned by the task world's study on the same test
problems (``benchmarks/experiments/real_task_results.json``): its share of the
oracle's saving in target calls per correct answer.

    python -m benchmarks.experiments.real_oracle [--data datasets/pairs/smollm2/results/task]
        [--modes greedy sample] [--problems 16] [--page] [--render]

The figures go to ``benchmarks/experiments/real_oracle.json``; ``--page`` writes the
section ``real-oracle`` of docs/results/real-pair.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from benchmarks.common import ROOT, minutes, publish  # noqa: E402

from evolve.io import paths  # noqa: E402
from benchmarks.experiments.trace_results import _commit, _shown  # noqa: E402

OUT = ROOT / "benchmarks" / "experiments" / "real_oracle.json"
STUDY = ROOT / "benchmarks" / "experiments" / "real_task_results.json"
SECTION = "real-oracle"
DATA = paths.DATA_DIR / "pairs" / "smollm2" / "results" / "task"


def headroom(data: Path, problems: int) -> dict:
    from evolve.data.sources.task import pair as TP, record
    from evolve.freerun import task_compare as TC
    from evolve.rules.oracle import AnswerOracle
    meta = record.load(data, "test").meta
    pair = TP.rebuild(meta)
    greedy = meta["decoding"] == "greedy"
    oracle = AnswerOracle()
    t0 = time.perf_counter()
    res = TC.compare(pair, {"lossless": None, "oracle": oracle}, "test", problems, greedy,
                     progress=lambda s: print(s, file=sys.stderr, flush=True))
    res["seconds"] = round(time.perf_counter() - t0, 1)
    res["judged"], res["kept"] = oracle.judged, oracle.kept
    return res


def shares(mode: str, res: dict) -> list:
    """Each rule the study tuned, on the same test problems: its calls per correct
    answer and its share of the oracle's saving (None where the study is absent or
    decoded other problems)."""
    if not STUDY.exists():
        return []
    study = json.loads(STUDY.read_text())["modes"].get(mode)
    if not study:
        return []
    lossless = res["rules"]["lossless"]["calls_per_correct"]
    room = lossless - res["rules"]["oracle"]["calls_per_correct"]
    per = res["rules"]["lossless"]["calls_per_problem"]
    room_per = per - res["rules"]["oracle"]["calls_per_problem"]
    out = []
    rep = study["tradeoff"]
    if rep["problems"]["test"] != res["problems"]:
        return []
    for entry in rep["budgets"]:
        for r in entry["rows"]:
            t = r.get("test")
            if t is None or r.get("kind") == "oracle":
                continue
            cpc = t["calls_per_correct"]
            out.append({"rule": r["rule"], "param": r.get("param"), "budget": entry["budget"],
                        **{k: t.get(k) for k in ("calls_per_correct", "calls_per_problem",
                                                 "accuracy", "agreement", "answer_tokens",
                                                 "tokens_per_call")},
                        "share": (lossless - cpc) / room if room > 0 else None,
                        "share_per_answer": ((per - t["calls_per_problem"]) / room_per
                                             if room_per > 0 else None)})
    return out


def markdown(doc: dict) -> str:
    lines = [f"Figures in `{doc['out']}`. Test problems, decoded free-running with the two models, "
             "the lossless rule and the oracle on the same problems and uniforms; each "
             "tuned rule's figures are those of the study above on the same problems.", ""]
    for mode, m in doc["modes"].items():
        r, v = m["rules"], m["versus_reference"]["oracle"]
        ll, o = r["lossless"], r["oracle"]
        c, p = v["calls_per_correct"], v["calls_per_problem"]
        ci = "" if c is None else (f" (oracle minus lossless {c['difference']:+.2f}, 95% "
                                   f"interval {c['ci95'][0]:+.2f} to {c['ci95'][1]:+.2f})")
        fewer = (f"{-p['difference']:.2f} fewer" if p["difference"] <= 0
                 else f"{p['difference']:.2f} more")
        ci += (f", and {fewer} per answer ({p['difference']:+.2f}, "
               f"{p['ci95'][0]:+.2f} to {p['ci95'][1]:+.2f}), agreement with the lossless "
               f"answers {o['agreement']:.3f}")
        lines += [f"**{mode.capitalize()} decoding**, {m['problems']} test problems "
                  f"(`{m['command']}` at commit {m['commit']}, "
                  f"{minutes(m['seconds'])}; the oracle judged {m['judged']:,} "
                  f"drafts the lossless rule could reject and kept {m['kept']:,}):", "",
                  "| rule | target calls per correct answer | per answer | accuracy | "
                  "agreement | answer tokens | tokens per call | share of the oracle's saving "
                  "per correct answer | per answer |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for name, s in (("lossless", ll), ("oracle", o)):
            lines.append(f"| {name} | {s['calls_per_correct']:.2f} | "
                         f"{s['calls_per_problem']:.2f} | {s['accuracy']:.3f} | "
                         f"{s['agreement']:.3f} | {s['answer_tokens']:.1f} | "
                         f"{s['tokens_per_call']:.3f} | {'' if name == 'lossless' else '1'} | "
                         f"{'' if name == 'lossless' else '1'} |")
        for t in m["tuned"]:
            share = " | ".join("" if t.get(k) is None else f"{t[k]:.2f}"
                               for k in ("share", "share_per_answer"))
            lines.append(f"| {t['rule']} (tuned, budget {t['budget']:g}) | "
                         f"{t['calls_per_correct']:.2f} | {t['calls_per_problem']:.2f} | "
                         f"{t['accuracy']:.3f} | {t['agreement']:.3f} | "
                         f"{t['answer_tokens']:.1f} | {t['tokens_per_call']:.3f} | {share} |")
        same = m.get("study_lossless_test")
        check = ("" if same is None else f" The study's lossless decoding of the same "
                 f"problems: {same:.2f} target calls per correct answer"
                 + ("." if m.get("same_lossless") else
                    ", not this run's (its recording sampled other texts), so its rules "
                    "are not set beside the oracle here."))
        saved = ll["calls_per_correct"] - o["calls_per_correct"]
        verb = (f"saves {saved:.2f}" if saved >= 0 else f"takes {-saved:.2f} more")
        lines += ["", f"The oracle {verb} target calls per correct answer{ci}.{check}", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DATA,
                    help="the folder of the task recordings, one per decoding")
    ap.add_argument("--modes", nargs="+", default=["greedy", "sample"])
    ap.add_argument("--problems", type=int, default=16)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--page", action="store_true")
    ap.add_argument("--render", action="store_true",
                    help="decode nothing: the tables again from --out, the study's rules "
                         "read again")
    a = ap.parse_args(argv)
    if a.render:
        doc = json.loads(a.out.read_text())
        for mode, res in doc["modes"].items():
            res["tuned"] = shares(mode, res) if res.get("same_lossless") else []
        return publish(doc, a.out, markdown, SECTION, a.page)
    doc = {"commit": _commit(),
           "command": " ".join(["python -m benchmarks.experiments.real_oracle",
                                *(argv if argv is not None else sys.argv[1:])]),
           "out": _shown(a.out), "modes": {}}
    if a.out.exists():                       # a decoding run before keeps its figures
        doc["modes"] = json.loads(a.out.read_text()).get("modes", {})
    for mode in a.modes:
        res = headroom(a.data / mode, a.problems)
        res["command"], res["commit"] = doc["command"], doc["commit"]
        study = json.loads(STUDY.read_text())["modes"].get(mode) if STUDY.exists() else None
        same = (study is not None and study["data"] == _shown(a.data / mode)
                and study["tradeoff"]["problems"]["test"] == res["problems"])
        res["study_lossless_test"] = (study["tradeoff"]["lossless"]["test"]
                                      ["calls_per_correct"] if same else None)
        # the study's rules are set beside the oracle only where its lossless decoding of
        # these problems is this one's (the same texts: a recording made on another
        # machine can sample other tokens at a float boundary)
        mine = res["rules"]["lossless"]["calls_per_correct"]
        res["same_lossless"] = same and abs(res["study_lossless_test"] - mine) <= 1e-9 * mine
        res["tuned"] = shares(mode, res) if res["same_lossless"] else []
        doc["modes"][mode] = res
        a.out.write_text(json.dumps(doc, indent=1) + "\n")    # each decoding as it ends
    return publish(doc, a.out, markdown, SECTION, a.page)


if __name__ == "__main__":
    raise SystemExit(main())
