"""Commands for speculative-decoding traces: ``data trace``, ``simulate``, ``tradeoff``.

Registered on the ``evolve`` group of ``evolve.cli`` (which imports this module
at its end). As there: one function per command, heavy modules imported inside
commands, known errors as one line on stderr and exit code 2, ``--json`` prints
one JSON document on stdout. The numerics live in ``evolve.traces``,
``evolve.simulate`` and ``evolve.pareto``.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import click

from evolve.cli import (EXIT_BAD_INPUT, _default_traces, _term, data_group, friendly_errors,
                        json_option, main, runs_dir_option)

# evolve.traces.TraceConfig's defaults, spelled out so that `--help` need not import
# numpy (tests/test_cli_trace.py checks that they are the same).
TRACE_DEFAULTS = {"seed": 0, "block_size": 4, "top_k": 16, "temperature": 1.0,
                  "blocks_per_prompt": 16, "train_prompts": 512, "valid_prompts": 256,
                  "test_prompts": 256, "max_files": None, "max_bytes_per_file": None}
SPLIT_NAMES = ("train", "valid", "test")
DEFAULT_BUDGETS = (0.01, 0.03)

traces_option = click.option("--data", "data_dir", type=click.Path(path_type=Path), default=None,
                             help="Directory with train/valid/test trace splits "
                                  "(default: datasets/traces/).")


def _fail(message: str):
    """A bad option or input: one line on stderr, exit code 2 (as friendly_errors)."""
    _term().error(message)
    sys.exit(EXIT_BAD_INPUT)


def _need(ok: bool, option: str, value, expected: str) -> None:
    if not ok:
        _fail(f"{option}: {value!r} is invalid; expected {expected}")


def _option_of(field: str) -> str:
    return "--" + field.replace("_", "-")


def _jsonable(obj):
    """Non-finite floats (an SE of one block, a never-reached position) become null."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    return obj


def _num(x, fmt: str = ".4f") -> str:
    return "-" if x is None or not math.isfinite(x) else format(x, fmt)


# -------------------------------------------------------------- data trace

@data_group.command("trace")
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="Output directory (default: datasets/traces/).")
@click.option("--seed", type=int, default=TRACE_DEFAULTS["seed"], show_default=True,
              help="Seed of the file split, the draft's files and every prompt.")
@click.option("--block-size", type=int, default=TRACE_DEFAULTS["block_size"], show_default=True,
              help="Drafted bytes per block (g).")
@click.option("--top-k", type=int, default=TRACE_DEFAULTS["top_k"], show_default=True,
              help="Draft candidates stored per drafted position.")
@click.option("--temperature", type=float, default=TRACE_DEFAULTS["temperature"],
              show_default=True, help="Sampling temperature of both models.")
@click.option("--blocks-per-prompt", type=int, default=TRACE_DEFAULTS["blocks_per_prompt"],
              show_default=True, help="Blocks decoded from each prompt.")
@click.option("--train-prompts", type=int, default=TRACE_DEFAULTS["train_prompts"],
              show_default=True, help="Prompts of the train split.")
@click.option("--valid-prompts", type=int, default=TRACE_DEFAULTS["valid_prompts"],
              show_default=True, help="Prompts of the valid split.")
@click.option("--test-prompts", type=int, default=TRACE_DEFAULTS["test_prompts"],
              show_default=True, help="Prompts of the test split.")
@click.option("--max-files", type=int, default=None,
              help="Use only the first N corpus files (quick builds; default: all).")
@click.option("--max-bytes-per-file", type=int, default=None,
              help="Use only the first N bytes of each corpus file (quick builds).")
@click.option("--force", is_flag=True, help="Overwrite existing splits that differ.")
@friendly_errors
def data_trace(out, seed, block_size, top_k, temperature, blocks_per_prompt, train_prompts,
               valid_prompts, test_prompts, max_files, max_bytes_per_file, force):
    """Build train/valid/test speculative-decoding traces (see datasets/TRACES.md)."""
    import re

    import numpy as np

    from evolve import traces
    from evolve.data import DataError
    out = Path(out) if out else _default_traces()
    term = _term()
    _need(max_files is None or max_files >= 4, "--max-files", max_files,
          "at least 4 (the models and three prompt pools need files)")
    _need(max_bytes_per_file is None or max_bytes_per_file >= 1, "--max-bytes-per-file",
          max_bytes_per_file, "at least 1")
    try:
        cfg = traces.TraceConfig(seed=seed, block_size=block_size, top_k=top_k,
                                 temperature=temperature, blocks_per_prompt=blocks_per_prompt,
                                 train_prompts=train_prompts, valid_prompts=valid_prompts,
                                 test_prompts=test_prompts, max_files=max_files,
                                 max_bytes_per_file=max_bytes_per_file)
        cfg.validate()
    except ValueError as e:     # "trace config: block_size=0 is invalid; expected 1..64"
        m = re.match(r"trace config: (\w+)=(.*)$", str(e))
        _fail(f"{_option_of(m.group(1))}: {m.group(2)}" if m else str(e))
    # A file of another configuration is refused before the build (the build would differ).
    if not force:
        for name in SPLIT_NAMES:
            path = out / f"{name}.npz"
            if path.exists() and _recorded_config(path) != cfg.to_dict():
                raise DataError(f"{path}: exists and differs; pass --force to overwrite")
    t0 = time.perf_counter()
    term.note(f"building traces (seed {seed}, g = {block_size}, k = {top_k}, "
              f"temperature {temperature:g}) ...")
    try:
        built = traces.build_splits(cfg, None, progress=term.note)
    except ValueError as e:      # the corpus cannot support this configuration
        _fail(f"trace build: {e}")
    # Check every file before writing any, so a refusal leaves the directory as it was.
    todo = []
    for name, ts in built.items():
        path = out / f"{name}.npz"
        if path.exists():
            try:
                old = traces.load(path, name=name)
                same = (old.meta.get("config") == cfg.to_dict()
                        and all(np.array_equal(old.columns[f], ts.columns[f])
                                for f in traces.ALL_FIELDS))
            except DataError:
                same = False
            if same:
                term.note(f"{path}: unchanged ({len(ts):,} rows)")
                continue
            if not force:
                raise DataError(f"{path}: exists and differs; pass --force to overwrite")
        todo.append((path, ts))
    for path, ts in todo:
        traces.save(ts, path)
        term.note(f"{path}: {len(ts):,} rows, {path.stat().st_size / 1e6:.1f} MB")
    term.note(f"done in {time.perf_counter() - t0:.1f} s")


def _recorded_config(path: Path):
    """The generation config in a trace file's meta.json (None if unreadable)."""
    import json
    import zipfile
    try:
        with zipfile.ZipFile(path) as zf:
            meta = json.loads(zf.read("meta.json").decode("utf-8"))
        return meta.get("config") if isinstance(meta, dict) else None
    except (OSError, KeyError, ValueError, zipfile.BadZipFile):
        return None


# ---------------------------------------------------------------- shared

def _load_split(data_dir: Path, split: str):
    from evolve import traces
    return traces.load(Path(data_dir) / f"{split}.npz", name=split)


def _pair_for(ts, term):
    """The draft/target pair rebuilt from a split's recorded configuration."""
    from evolve import traces
    from evolve.data import DataError
    src = ts.meta.get("source", ts.name)
    try:
        cfg = ts.config()
    except (KeyError, TypeError, ValueError) as e:
        raise DataError(f"{src}: meta.json has no usable trace config ({e})") from None
    pair = traces.build_pair(cfg)
    recorded = (ts.meta.get("models") or {}).get("corpus_crc32")
    same = recorded is None or recorded == pair.corpus.fingerprint()
    if not same:
        term.note(f"warning: {src} was built from another corpus (another Python version?); "
                  "the rebuilt models differ from the ones that made the traces")
    return pair, same


def _run_rule(runs_parent: Path, run: str):
    """(rule, info) of a run's champion: its tree parsed (never evaluated)."""
    from evolve import codegen, runs, simulate, treeio
    rd = runs.RunDir.open(runs_parent, run)
    champ = rd.champion()
    try:
        nodes = treeio.parse(champ["tree"])
    except treeio.TreeError as e:
        raise runs.RunError(f"{rd.file('champion.json')}: field 'tree': {e}") from None
    name = f"run {rd.name}"
    info = {"kind": "run", "name": rd.name, "label": name, "param": None,
            "tree": champ["tree"], "expression": codegen.infix(nodes),
            "objective": champ.get("objective"), "tv_budget": champ.get("tv_budget")}
    return simulate.tree_rule(nodes, name), info


# -------------------------------------------------------------- simulate

@main.command("simulate")
@click.option("--heuristic", "heuristic", default=None, metavar="NAME",
              help="A baseline of heuristics/baselines.py (e.g. standard_rejection) or a rule "
                   "family of evolve/pareto.py (standard, leniency, ears, typical, bild).")
@click.option("--param", type=float, default=None,
              help="The family's parameter (leniency l, ears beta, typical eps, bild alpha; "
                   "default: the family's own).")
@click.option("--run", "run", default=None, metavar="RUN",
              help="Use the champion of this run directory instead.")
@traces_option
@click.option("--split", default="test", show_default=True,
              help="Trace split: the prompt pool and the offline estimate.")
@click.option("--prompts", type=int, default=None,
              help="Prompts to decode (default: as many as the split has).")
@click.option("--blocks", type=int, default=None,
              help="Blocks per prompt (default: as in the split).")
@click.option("--contexts", type=int, default=200, show_default=True,
              help="Contexts of the split at which the emitted byte is sampled.")
@click.option("--reps", type=int, default=2000, show_default=True,
              help="Samples of the emitted byte per context.")
@click.option("--seed", type=int, default=1, show_default=True,
              help="Seed of the simulated prompts and draws.")
@runs_dir_option
@json_option
@friendly_errors
def simulate_cmd(heuristic, param, run, data_dir, split, prompts, blocks, contexts, reps, seed,
                 runs_dir, json_mode):
    """Real speculative decoding with a rule, next to its offline exact estimate.

    Rebuilds the draft/target pair from the split's recorded configuration,
    decodes from the split's prompt pool with the rule (tokens per target call)
    and samples the emitted byte at contexts of the split (TV from the target),
    and shows the offline numbers of `evolve.spec` for the same rule on that split:
    they should agree within sampling error."""
    from evolve import runs, simulate
    if (heuristic is None) == (run is None):
        _fail("give one of --heuristic NAME or --run RUN")
    if run is not None and param is not None:
        _fail("--param: only with --heuristic (a run's champion has no parameter)")
    _need(split in SPLIT_NAMES, "--split", split, "one of " + ", ".join(SPLIT_NAMES))
    _need(prompts is None or prompts >= 2, "--prompts", prompts, "at least 2")
    _need(blocks is None or blocks >= 1, "--blocks", blocks, "at least 1")
    _need(contexts >= 1, "--contexts", contexts, "at least 1")
    _need(reps >= 2, "--reps", reps, "at least 2")
    _need(seed >= 0, "--seed", seed, "an integer >= 0")
    data_dir = Path(data_dir) if data_dir else _default_traces()
    term = _term(json_mode)
    if heuristic is not None:
        try:
            rule, info = simulate.named_rule(heuristic, param)
        except ValueError as e:
            _fail(str(e))
    else:
        rule, info = _run_rule(runs.runs_dir(runs_dir), run)
    ts = _load_split(data_dir, split)
    t0 = time.perf_counter()
    term.note(f"{info['label']}: rebuilding the draft/target pair of {data_dir / split}.npz")
    pair, same_corpus = _pair_for(ts, term)
    res = simulate.check_rule(pair, ts, rule, split=split, prompts=prompts, blocks=blocks,
                              contexts=contexts, reps=reps, seed=seed, progress=term.note)
    doc = {"rule": info, "data": str(data_dir), "corpus_matches_trace": same_corpus, **res,
           "seconds": round(time.perf_counter() - t0, 3)}
    if json_mode:
        term.print_json(_jsonable(doc))
        return
    _show_simulation(doc, term)


def _pm(x, se, fmt=".4f") -> str:
    return f"{_num(x, fmt)} ± {_num(se, fmt)}" if se is not None else _num(x, fmt)


def _show_simulation(doc: dict, term) -> None:
    sim, off, agr, st = doc["simulated"], doc["offline"], doc["agreement"], doc["settings"]
    out = sim["output"]
    tok, tv = agr["tokens_per_call"], agr["tv_at_contexts"]
    rows = [["tokens per target call", _pm(sim["tokens_per_call"], sim["tokens_se"]),
             _pm(off["tokens_per_call"], off["tokens_se_by_sequence"]),
             f"{tok['difference']:+.4f}", _num(tok["z"], "+.2f")],
            [f"TV at {st['contexts']} contexts", _pm(out["tv_witness"], out["tv_witness_se"]),
             _num(off["tv_at_contexts"]), f"{tv['difference']:+.4f}", _num(tv["z"], "+.2f")]]
    for j, (a_sim, a_off) in enumerate(zip(sim["acceptance"], off["acceptance"])):
        rows.append([f"acceptance at block position {j}", _num(a_sim), _num(a_off), "", ""])
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


# -------------------------------------------------------------- tradeoff

@main.command("tradeoff")
@traces_option
@click.option("--budget", "budgets", type=float, multiple=True,
              help="TV per token allowed (repeatable) [default: 0.01 and 0.03].")
@click.option("--run", "run_names", multiple=True, metavar="RUN",
              help="Add the champion of this run directory (repeatable).")
@runs_dir_option
@click.option("--png", type=click.Path(path_type=Path), default=None,
              help="Also draw the trade-off on test to this PNG file (every point).")
@click.option("--max-tv", type=float, default=None,
              help="Right edge of the terminal picture [default: 4 x the largest budget].")
@json_option
@friendly_errors
def tradeoff_cmd(data_dir, budgets, run_names, runs_dir, png, max_tv, json_mode):
    """Literature rules tuned to TV budgets on valid, reported on test.

    Every rule family of evolve/pareto.py is swept on valid and test; for each
    budget each family is tuned on valid and its test numbers are shown, next
    to the champions of the --run directories."""
    from evolve import pareto, runs, spec, traces
    budgets = list(dict.fromkeys(budgets)) or list(DEFAULT_BUDGETS)
    for b in budgets:
        _need(math.isfinite(b) and b >= 0, "--budget", b, "a TV per token >= 0")
    _need(max_tv is None or max_tv > 0, "--max-tv", max_tv, "a TV per token > 0")
    data_dir = Path(data_dir) if data_dir else _default_traces()
    term = _term(json_mode)
    extra, infos = {}, []
    parent = runs.runs_dir(runs_dir)
    for r in dict.fromkeys(run_names):
        rule, info = _run_rule(parent, r)
        extra[info["label"]] = rule
        infos.append(info)
    t0 = time.perf_counter()
    splits = traces.load_splits(data_dir, ("valid", "test"))
    sas = {s: spec.SpecArrays.from_split(ts) for s, ts in splits.items()}
    term.note(f"sweeping {len(pareto.RULES)} rule families on valid and test, tuning to "
              f"{len(budgets)} budget(s) ...")
    res = pareto.tradeoff(sas["valid"], sas["test"], budgets, extra)
    # standard last among the families: drawn over leniency l=1 and ears beta=0 (same point)
    names = [k for k in res["series"] if k in pareto.RULES and k != "standard"]
    names += [k for k in res["series"] if k not in names]
    series = {k: [tuple(xy) for xy in res["series"][k]] for k in names}
    png_path = None
    if png is not None:
        try:
            pareto.render_png(series, png, title=f"{data_dir}: test split "
                              f"(g = {res['block_size']}, k = {res['top_k']})")
        except RuntimeError as e:       # matplotlib missing
            _fail(f"--png: {e}")
        png_path = str(png)
        term.note(f"{png}: written")
    doc = {"data": str(data_dir), **res, "runs": infos, "png": png_path,
           "seconds": round(time.perf_counter() - t0, 3)}
    if json_mode:
        term.print_json(_jsonable(doc))
        return
    _show_tradeoff(doc, series, term, max_tv)


def _show_tradeoff(doc: dict, series: dict, term, max_tv: float | None) -> None:
    from evolve import pareto
    cols = [("rule", "left"), ("param", "right"), ("tokens/call", "right"), ("±", "right"),
            ("TV/token", "right"), ("KL/token", "right"), ("valid TV/token", "right"),
            ("", "left")]
    for entry in doc["budgets"]:
        b = entry["budget"]
        rows, styles = [], []
        for r in entry["rows"]:
            if r["kind"] == "family":
                spec_ = pareto.RULES[r["rule"]]
                param = "" if spec_.param is None or r["param"] is None else \
                    f"{spec_.param}={r['param']:.4g}"
            else:
                param = ""
            if r["test"] is None:
                rows.append([r["rule"], param, "-", "", "-", "-", "-",
                             "no parameter fits the budget on valid"])
                styles.append("dim")
                continue
            t, v = r["test"], r["valid"]
            note = []
            if not r["fits_valid"]:
                note.append("over budget on valid")
            if r["over_budget_test"]:
                note.append("over budget on test")
            rows.append([r["rule"], param, f"{t['tokens_per_call']:.4f}",
                         _num(t["tokens_se"]), f"{t['tv_per_token']:.4f}",
                         f"{t['kl_per_token']:.4f}", f"{v['tv_per_token']:.4f}",
                         "; ".join(note)])
            styles.append("yellow" if note else None)
        term.table(f"TV budget {b:g} per token: tuned on valid ({doc['blocks']['valid']:,} "
                   f"blocks), reported on test ({doc['blocks']['test']:,} blocks)",
                   cols, rows, styles)
        term.result("")
    # zoom on the budgets (the far end of bild/typical squeezes them into a few columns)
    edge = max_tv if max_tv is not None else 4 * max(e["budget"] for e in doc["budgets"])
    edge = max([edge] + [o["test"]["tv_per_token"] for o in doc["extra"].values()])
    shown = {k: [(x, y) for x, y in v if x <= edge] for k, v in series.items()}
    hidden = sum(len(v) for v in series.values()) - sum(len(v) for v in shown.values())
    term.result(f"test split of {doc['data']}: every family's parameter grid "
                f"(g = {doc['block_size']}, k = {doc['top_k']})"
                + (f"; {hidden} points with TV per token > {edge:g} not shown (--max-tv)"
                   if hidden else ""))
    term.result(pareto.render_text(shown))
    if doc["png"]:
        term.result(f"picture: {doc['png']}")
