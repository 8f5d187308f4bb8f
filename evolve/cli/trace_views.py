"""Views of the trace commands: `evolve simulate` (and its --compare table) and
`evolve tradeoff`."""

from __future__ import annotations

import math

from evolve.cli.views import render_text


def num(x, fmt: str = ".4f") -> str:
    return "-" if x is None or not math.isfinite(x) else format(x, fmt)


def pm(x, se, fmt=".4f") -> str:
    return f"{num(x, fmt)} ± {num(se, fmt.replace('+', ''))}" if se is not None \
        else num(x, fmt)


def show_simulation(doc: dict, term) -> None:
    sim, off, agr, st = doc["simulated"], doc["offline"], doc["agreement"], doc["settings"]
    out = sim["output"]
    tok, tv = agr["tokens_per_call"], agr["tv_at_contexts"]
    rows = [["tokens per target call", pm(sim["tokens_per_call"], sim["tokens_se"]),
             pm(off["tokens_per_call"], off["tokens_se_by_sequence"]),
             f"{tok['difference']:+.4f}", num(tok["z"], "+.2f")],
            [f"TV at {st['contexts']} contexts", pm(out["tv_witness"], out["tv_witness_se"]),
             num(off["tv_at_contexts"]), f"{tv['difference']:+.4f}", num(tv["z"], "+.2f")]]
    for j, (a_sim, a_off) in enumerate(zip(sim["acceptance"], off["acceptance"])):
        rows.append([f"acceptance at block position {j}", num(a_sim), num(a_off), "", ""])
    term.table(f"{doc['rule']['label']} on {doc['data']}, split {doc['split']} "
               f"(g = {doc['block_size']}, k = {doc['top_k']})",
               [("", "left"), ("simulated", "right"), ("offline (exact)", "right"),
                ("difference", "right"), ("z", "right")], rows)
    term.result(f"offline on the whole split: TV per token {off['tv_per_token']:.4f}, "
                f"KL per token {off['kl_per_token']:.4f}")
    term.result(f"sampled output: plug-in TV {out['tv_plugin']:.4f} (noise floor "
                f"{out['tv_plugin_floor']:.4f} for samples from the target itself)")
    term.result(f"simulation: {st['prompts']} prompts x {st['blocks']} blocks, "
                f"{st['contexts']} contexts x {st['reps']} samples, seed {st['seed']} "
                f"({doc['seconds']:.1f} s)")
    zs = [z for z in (tok["z"], tv["z"]) if z is not None]
    worst = max((abs(z) for z in zs), default=float("nan"))
    if agr["agree"]:
        term.result(f"simulation and offline estimate agree (largest |z| {worst:.2f} "
                    f"< {agr['z_agree']:g})")
    else:
        term.result(f"simulation and offline estimate DISAGREE (largest |z| {worst:.2f} "
                    f">= {agr['z_agree']:g})")


LOW_ESS = 0.1       # a trajectory estimate on fewer effective sequences is flagged


def show_tradeoff(doc: dict, series: dict, term, max_tv: float | None) -> None:
    from evolve.rules.table import RULES    # lazy: start-up (a command loads only what it runs)
    own = doc.get("trajectory", False)        # --trajectory: one more column
    cols = [("rule", "left"), ("param", "right"), ("tokens per call", "right"),
            ("own trajectory", "right"), ("TV per token", "right"), ("slot TV p99", "right"),
            ("KL per token", "right"), ("valid TV", "right"), ("of oracle", "right"),
            ("", "left")]
    keep = [i for i in range(len(cols)) if own or i != 3]
    for entry in doc["budgets"]:
        b = entry["budget"]
        rows, styles = [], []
        for r in entry["rows"]:
            if r["kind"] == "family":
                spec_ = RULES[r["rule"]]
                param = "" if spec_.param is None or r["param"] is None else \
                    f"{spec_.param}={r['param']:.4g}"
            elif r["kind"] == "headroom" and r["param"]:
                param = "/".join(f"{x:.2f}" for x in r["param"])
            elif r["kind"] == "learned" and r["param"] is not None:
                param = f"λ={r['param']:.4g}"
            else:
                param = ""
            if r["test"] is None:
                why = (("needs slot features" if "slot_" in r["not_exact"]
                        else "needs top-k = vocabulary") if r.get("not_exact")
                       else "no parameter fits on valid")
                rows.append([[r["rule"], param, "-", "-", "-", "-", "-", "-", "-",
                              why][i] for i in keep])
                styles.append("dim")
                continue
            t, v = r["test"], r["valid"]
            note = []
            if r["kind"] == "oracle":
                note.append("a bound, not a rule")
            elif not r["fits_valid"]:
                note.append("over budget on valid")
            if r.get("estimate"):
                note.append("estimate: reads a lookahead input")
            if r["over_budget_test"]:
                note.append("over budget on test")
            share = r.get("oracle_share")
            traj = t.get("trajectory")
            if traj is not None and traj["effective_sequences"] < LOW_ESS * traj["sequences"]:
                note.append("few effective sequences on its own trajectory")
            rows.append([[r["rule"], param, pm(t["tokens_per_call"], t["tokens_se"]),
                          "-" if traj is None else pm(traj["tokens_per_call"],
                                                       traj["tokens_se"]),
                          f"{t['tv_per_token']:.4f}",
                          num(t.get("tv_p99")), f"{t['kl_per_token']:.4f}",
                          f"{v['tv_per_token']:.4f}" if v else "-",
                          "-" if share is None else f"{100 * share:.0f}%",
                          "; ".join(note)][i] for i in keep])
            styles.append("yellow" if note else None)
        term.table(f"TV budget {b:g} per token: tuned on valid ({doc['blocks']['valid']:,} "
                   f"blocks), reported on test ({doc['blocks']['test']:,} blocks)",
                   [cols[i] for i in keep], rows, styles)
        for line in engine_settings(entry["rows"]):
            term.result(line)
        by = [r for r in entry["rows"] if (r["test"] or {}).get("tv_by_distance")]
        if by:
            first = by[0]["test"]["tv_by_distance"]
            term.table(f"TV budget {b:g}: mean slot TV on test by distance from the prompt "
                       "(0: the answer's first token)",
                       [("rule", "left")] + [(k, "right") for k in first],
                       [[r["rule"]] + ["-" if v["tv"] is None else f"{v['tv']:.4f}"
                                       for v in r["test"]["tv_by_distance"].values()]
                        for r in by])
        term.result("")
    term.result("to deploy a row: an engine setting above (no patch); a run, evolve export "
                "RUN;\nany other rule but the oracle (a bound), from Python: "
                "evolve.export(evolve.tradeoff(...).rule(BUDGET, NAME),\nformat=...), in the "
                "formats each row's 'export' names (--json)")
    if own:
        term.result("own trajectory: tokens per call re-weighted to each rule's own free-"
                    "running trajectory (unbiased; standard error by sequence)")
    # zoom on the budgets (the far end of bild/typical squeezes them into a few columns)
    edge = max_tv if max_tv is not None else 4 * max(e["budget"] for e in doc["budgets"])
    edge = max([edge] + [o["test"]["tv_per_token"] for o in doc["extra"].values()])
    shown = {k: [(x, y) for x, y in v if x <= edge] for k, v in series.items()}
    hidden = sum(len(v) for v in series.values()) - sum(len(v) for v in shown.values())
    term.result(f"test split of {doc['data']}: every family's parameter grid "
                f"(g = {doc['block_size']}, k = {doc['top_k']})"
                + (f"; {hidden} points with TV per token > {edge:g} not shown (--max-tv)"
                   if hidden else ""))
    term.result(render_text(shown, budgets=[e["budget"] for e in doc["budgets"]]))
    if doc["png"]:
        term.result(f"picture: {doc['png']}")


def engine_settings(rows) -> list[str]:
    """Lines of a budget's engine rows: the engine's own flags or keyword arguments for
    the tuned value (paste as they are), or why there is none. The other rules need a
    patch (``evolve export``)."""
    lines = []
    for r in rows:
        if r.get("engine") is None:
            continue
        if r.get("setting"):
            t = r["test"]
            lines.append(f"{r['engine']}: {r['setting']}   ({r['rule']}: "
                         f"{t['tokens_per_call']:.4f} tokens/call, TV/token "
                         f"{t['tv_per_token']:.4f} on test; no patch)")
        elif r.get("not_exact"):
            lines.append(f"{r['engine']}: {r['rule']}: not scored: its residual (p without "
                         f"the draft) is exact only on traces recorded with top-k = the "
                         f"vocabulary")
        else:
            lines.append(f"{r['engine']}: {r['rule']}: no setting fits the budget on valid")
    if lines:
        lines.insert(0, "engine settings (the other rules need a patch, evolve export):")
    return lines


def show_comparison(doc: dict, term) -> None:
    """The paired free-running comparison of ``evolve simulate --compare``."""
    rules, vs = doc["rules"], doc["versus_reference"]
    ref = doc["reference"]
    g = doc["block_size"]
    cols = [("rule", "left"), ("tokens/call", "right"), ("TV/token", "right"),
            ("KL/token", "right"), ("slot TV by position", "right"), ("slot TV p99", "right"),
            ("log p / token", "right"), ("log q / token", "right")]
    rows, notes = [], []
    for name, r in rules.items():
        kind = (r.get("distortion") or {}).get("kind", "exact")
        mark = " ~" if kind == "estimate" else ""
        if kind == "estimate":
            d = r["distortion"]
            notes.append(f"{name} ~: TV and KL estimated: {d['why']} ({d['slots']:,} of "
                         f"{d['reached']:,} reached slots, {d['futures']} futures per "
                         f"candidate; mean slot TV {d['slot_tv_mean']:.5f}, "
                         f"{d['slot_tv_mean_half_futures']:.5f} at half the futures)")
        rows.append([name + mark, pm(r["tokens_per_call"], r["tokens_se"]),
                     pm(r["tv_per_token"], r["tv_se"], ".5f"),
                     pm(r["kl_per_token"], r["kl_se"], ".5f"),
                     " ".join(f"{x:.4f}" for x in r["slot_tv_by_position"]),
                     f"{r['slot_tv_p99']:.4f}", f"{r['target_loglik_per_token']:.4f}",
                     f"{r['draft_loglik_per_token']:.4f}"])
    term.table(f"free-running on {doc['data']}, split {doc['split']}: {doc['prompts']} "
               f"prompts x {doc['blocks']} blocks (g = {g}), the same prompts and uniforms "
               f"for every rule, seed {doc['seed']}", cols, rows)
    if vs:
        cols = [("rule minus " + ref, "left"), ("tokens/call", "right"), ("95% interval", "right"),
                ("TV/token", "right"), ("log p / token", "right"), ("log q / token", "right")]
        rows = []
        for name, d in vs.items():
            t = d["tokens_per_call"]
            dtv = d["tv_per_token"]
            rows.append([name, pm(t["difference"], t["se"]),
                         f"[{t['ci95'][0]:+.4f}, {t['ci95'][1]:+.4f}]",
                         pm(dtv["difference"], dtv["se"], "+.5f"),
                         pm(d["target_loglik_per_token"]["difference"],
                             d["target_loglik_per_token"]["se"], "+.4f"),
                         pm(d["draft_loglik_per_token"]["difference"],
                             d["draft_loglik_per_token"]["se"], "+.4f")])
        term.table("paired differences (standard errors by sequence)", cols, rows)
    first = next(iter(rules.values()), {}).get("tv_by_distance")
    if first:
        cols = [("rule", "left")] + [(f"{k}", "right") for k in first]
        term.table("mean slot TV by distance from the prompt (0: the answer's first token)",
                   cols, [[name] + ["-" if v["tv"] is None else f"{v['tv']:.4f}"
                                    for v in r["tv_by_distance"].values()]
                          for name, r in rules.items()])
    for line in notes:
        term.result(line)
    term.result(f"({doc['seconds']:.1f} s)")


def _cost_source(tm: dict) -> str:
    """Where the time model's draft cost came from, in words."""
    m = tm.get("measured")
    if m is None:
        return f"the draft's cost per token --draft-cost {tm['draft_cost']:g}"
    return (f"the draft's cost per token measured now on this machine, {m['device']} with "
            f"{m['threads']} threads: one decoding step after {m['context']} tokens, batch "
            f"{m['batch']}, median of {m['reps']}, draft {m['draft_ms']:.1f} ms and target "
            f"{m['target_ms']:.1f} ms; --draft-cost C sets it")


def show_task_tradeoff(doc: dict, term) -> None:
    """``evolve tradeoff`` on task traces: per accuracy budget, every rule tuned on valid
    by free-running decoding and decoded once on test, what an answer costs first."""
    from evolve.cli.views import _diff    # lazy: start-up (one formatting of differences)
    sz = doc["sizes"]
    lossless = doc["lossless"]["test"]
    term.result(f"{doc['data']}: {doc['decoding']} decoding, {sz['train']:,} train / "
                f"{sz['valid']:,} valid / {sz['test']:,} test problems; tuned on "
                f"{doc['problems']['valid']:,} valid, reported on {doc['problems']['test']:,} "
                f"test problems (the same uniforms for every rule). Lossless on test: "
                f"{lossless['calls_per_problem']:.2f} target calls per answer, "
                f"{lossless['calls_per_correct']:.2f} per correct answer, accuracy "
                f"{lossless['accuracy']:.4f}.")
    tm = doc.get("time_model")
    if tm is not None:
        term.result(f"Time in target calls: a call verifying {tm['block_size']} drafts costs "
                    f"1 + {tm['block_size']} x {tm['draft_cost']:.3g} = "
                    f"{tm['call_cost']:.3g} ({_cost_source(tm)}); the "
                    f"target alone takes one call a token. Lossless: "
                    f"{lossless['time_per_correct']:.2f} per correct answer, "
                    f"{lossless['speedup']:.2f}x the target alone.")
    for entry in doc["budgets"]:
        b = entry["budget"]
        cols = [("rule", "left"), ("param", "right"), ("calls/answer", "right"),
                ("calls/correct", "right"), ("accuracy", "right"), ("agreement", "right"),
                ("answer tokens", "right"), ("tokens/call", "right"),
                ("calls/correct minus lossless [95%]", "right")]
        timed = tm is not None
        if timed:
            cols[4:4] = [("time/correct", "right"), ("vs target alone", "right")]
        oracle = any(r["kind"] == "oracle" for r in entry["rows"])
        if oracle:
            cols.append(("of oracle", "right"))
        rows = []
        for r in entry["rows"]:
            t = r["test"]
            mark = " *" if r["rule"] == entry["best"] else ""
            if t is None:
                rows.append([r["rule"] + mark, "-", "no parameter fits on valid", "", "", "",
                             "", "", ""] + [""] * (oracle + 2 * timed))
                continue
            share = r.get("oracle_share")
            time_cols = ([f"{t['time_per_correct']:.2f}", f"{t['speedup']:.2f}x"]
                         if timed else [])
            rows.append([r["rule"] + mark, "-" if r["param"] is None else f"{r['param']:g}",
                         f"{t['calls_per_problem']:.2f}",
                         f"{t['calls_per_correct']:.2f}", *time_cols, f"{t['accuracy']:.4f}",
                         f"{t['agreement']:.4f}", f"{t['answer_tokens']:.1f}",
                         f"{t['tokens_per_call']:.3f}",
                         _diff(r["versus_lossless"].get("calls_per_correct"), 2)]
                        + ([("" if r["kind"] == "oracle" else "-") if share is None
                            else f"{share:.0%}"] if oracle else []))
        term.table(f"accuracy budget {b:g}: tuned on valid (drop <= {b:g}), test (* the best "
                   "baseline: fewest calls per correct answer"
                   + ("; the oracle is a bound, not a rule: of oracle is the share of its "
                      "saving in calls per correct answer" if oracle else "")
                   + (f", the oracle's row and every share on the first "
                      f"{doc['oracle_problems']:,} test problems"
                      if oracle and (doc.get("oracle_problems") or 0)
                      < doc["problems"]["test"] else "") + ")",
                   cols, rows)
        for r in entry["rows"]:
            if r.get("versus_best") is not None:
                d = r["versus_best"]
                term.result(f"{r['rule']} minus {entry['best']}: calls per correct answer "
                            f"{_diff(d.get('calls_per_correct'), 2)}, accuracy "
                            f"{_diff(d['accuracy'], 4)}")
    term.result(f"({doc['seconds']:.1f} s)")
