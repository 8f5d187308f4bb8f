"""Commands for speculative-decoding traces: ``data trace``, ``simulate``, ``tradeoff``.

One function per command, heavy modules imported inside commands, known errors
as one line on stderr and exit code 2, ``--json`` prints one JSON document on
stdout. The numerics live in ``evolve.data.sources.ngram``, ``evolve.simulate``
and ``evolve.rules.tuning``; the views in ``evolve.cli.views``.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import click

from evolve.cli import views
from evolve.cli.common import (default_traces, fail, friendly_errors, json_option, need,
                               runs_dir_option, term)

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


# -------------------------------------------------------------- data trace

@click.command("trace")
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
@click.option("--backend", type=click.Choice(["ngram", "hf"]), default="ngram",
              show_default=True, help="ngram: the byte-level n-gram pair built here; hf: "
                                      "a Hugging Face draft/target pair (--target, --draft).")
@click.option("--target", default=None, metavar="PATH_OR_ID",
              help="hf: the target model, a directory or hub id (AutoModelForCausalLM).")
@click.option("--draft", default=None, metavar="PATH_OR_ID", help="hf: the draft model.")
@click.option("--device", default="cpu", show_default=True, help="hf: cpu, cuda or auto.")
@click.option("--dtype", default="float32", show_default=True,
              help="hf: float32, float16, bfloat16 or auto (bfloat16 on cuda).")
@click.option("--batch-size", type=int, default=16, show_default=True,
              help="hf: prompts decoded together.")
@click.option("--prompts", "prompts_file", type=click.Path(path_type=Path), default=None,
              help="hf: JSON lines with a 'text' field (and an optional 'split').")
@click.option("--corpus", "corpus_dir", type=click.Path(path_type=Path), default=None,
              help="hf: draw prompts from the files under DIR (default: the n-gram corpus).")
@click.option("--prompt-len", type=int, default=64, show_default=True,
              help="hf: tokens per prompt drawn from a corpus.")
@click.option("--context-len", type=int, default=0, show_default=True,
              help="hf: tokens of context stored per drafted position (0: none).")
@friendly_errors
def data_trace(out, seed, block_size, top_k, temperature, blocks_per_prompt, train_prompts,
               valid_prompts, test_prompts, max_files, max_bytes_per_file, force, backend,
               target, draft, device, dtype, batch_size, prompts_file, corpus_dir, prompt_len,
               context_len):
    """Build train/valid/test speculative-decoding traces (see datasets/TRACES.md)."""
    import numpy as np

    from evolve.data import traces
    from evolve.data.sources import hf, ngram
    from evolve.data.tokens import DataError
    out = Path(out) if out else default_traces()
    tm = term()
    need(max_files is None or max_files >= 4, "--max-files", max_files,
          "at least 4 (the models and three prompt pools need files)")
    need(max_bytes_per_file is None or max_bytes_per_file >= 1, "--max-bytes-per-file",
          max_bytes_per_file, "at least 1")
    hf_only = {"--target": target, "--draft": draft, "--prompts": prompts_file,
               "--corpus": corpus_dir}
    try:
        if backend == "hf":
            if target is None or draft is None:
                fail("--backend hf needs both --target and --draft (a directory or hub id)")
            cfg = hf.HFTraceConfig(
                target=target, draft=draft, seed=seed, block_size=block_size, top_k=top_k,
                temperature=temperature, blocks_per_prompt=blocks_per_prompt,
                prompt_len=prompt_len, train_prompts=train_prompts,
                valid_prompts=valid_prompts, test_prompts=test_prompts,
                context_len=context_len, device=device, dtype=dtype, batch_size=batch_size,
                prompts_file=None if prompts_file is None else str(prompts_file),
                corpus_dir=None if corpus_dir is None else str(corpus_dir),
                max_files=max_files, max_bytes_per_file=max_bytes_per_file)
        else:
            given = [k for k, v in hf_only.items() if v is not None]
            if given:
                fail(f"{given[0]}: only with --backend hf")
            cfg = ngram.TraceConfig(seed=seed, block_size=block_size, top_k=top_k,
                                     temperature=temperature, blocks_per_prompt=blocks_per_prompt,
                                     train_prompts=train_prompts, valid_prompts=valid_prompts,
                                     test_prompts=test_prompts, max_files=max_files,
                                     max_bytes_per_file=max_bytes_per_file)
        cfg.validate()
    except ngram.TraceConfigError as e:
        fail(f"{_option_of(e.field)}: {e.detail}")
    # A file of another configuration is refused before the build (the build would differ).
    if not force:
        for name in SPLIT_NAMES:
            path = out / f"{name}.npz"
            if path.exists() and _recorded_config(path) != cfg.to_dict():
                raise DataError(f"{path}: exists and differs; pass --force to overwrite")
    t0 = time.perf_counter()
    if backend == "ngram":   # the hf build says so once its models have loaded
        tm.note(f"building traces (seed {seed}, g = {block_size}, k = {top_k}, "
                f"temperature {temperature:g}) ...")
    try:
        built = (hf.build_splits(cfg, progress=tm.note) if backend == "hf"
                 else ngram.build_splits(cfg, None, progress=tm.note))
    except ngram.TraceConfigError as e:
        fail(f"{_option_of(e.field)}: {e.detail}")
    except hf.HFTraceError as e:     # a pair that cannot be used: the line says why
        fail(str(e))
    except ValueError as e:      # the pair or corpus cannot support this configuration
        fail(f"trace build: {e}")
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
                tm.note(f"{path}: unchanged ({len(ts):,} rows)")
                continue
            if not force:
                raise DataError(f"{path}: exists and differs; pass --force to overwrite")
        todo.append((path, ts))
    for path, ts in todo:
        traces.save(ts, path)
        tm.note(f"{path}: {len(ts):,} rows, {path.stat().st_size / 1e6:.1f} MB")
    tm.note(f"done in {time.perf_counter() - t0:.1f} s")


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
    from evolve.data import traces
    return traces.load(Path(data_dir) / f"{split}.npz", name=split)


def _pair_for(ts, out):
    """The draft/target pair rebuilt from a split's recorded configuration."""
    from evolve.data.sources import ngram
    from evolve.data.tokens import DataError
    src = ts.meta.get("source", ts.name)
    try:
        cfg = ngram.config_of(ts)
    except (KeyError, TypeError, ValueError) as e:
        raise DataError(f"{src}: meta.json has no usable trace config ({e})") from None
    pair = ngram.build_pair(cfg)
    recorded = (ts.meta.get("models") or {}).get("corpus_crc32")
    same = recorded is None or recorded == pair.corpus.fingerprint()
    if not same:
        out.note(f"warning: {src} was built from another corpus (another Python version?); "
                  "the rebuilt models differ from the ones that made the traces")
    return pair, same


def _run_rule(runs_parent: Path, run: str):
    """(rule, info) of a run's champion: its tree parsed (never evaluated)."""
    from evolve.lang import codegen, treeio
    from evolve.rules.adapters import tree_rule
    from evolve.runs import rundir as runs
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
    return tree_rule(nodes, name), info


# -------------------------------------------------------------- simulate

@click.command("simulate")
@click.option("--heuristic", "heuristic", default=None, metavar="NAME",
              help="A rule of the rules table (evolve/rules/table.py), e.g. standard_rejection "
                   "or leniency (with --param).")
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
    from evolve import simulate
    from evolve.rules.adapters import named_rule
    from evolve.runs import paths
    if (heuristic is None) == (run is None):
        fail("give one of --heuristic NAME or --run RUN")
    if run is not None and param is not None:
        fail("--param: only with --heuristic (a run's champion has no parameter)")
    need(split in SPLIT_NAMES, "--split", split, "one of " + ", ".join(SPLIT_NAMES))
    need(prompts is None or prompts >= 2, "--prompts", prompts, "at least 2")
    need(blocks is None or blocks >= 1, "--blocks", blocks, "at least 1")
    need(contexts >= 1, "--contexts", contexts, "at least 1")
    need(reps >= 2, "--reps", reps, "at least 2")
    need(seed >= 0, "--seed", seed, "an integer >= 0")
    data_dir = Path(data_dir) if data_dir else default_traces()
    out = term(json_mode)
    if heuristic is not None:
        try:
            rule, info = named_rule(heuristic, param)
        except ValueError as e:
            fail(str(e))
    else:
        rule, info = _run_rule(paths.runs_dir(runs_dir), run)
    ts = _load_split(data_dir, split)
    if ts.backend != "ngram":
        from evolve.data.tokens import DataError
        raise DataError(f"{data_dir / split}.npz: recorded by the {ts.backend} backend; "
                        "evolve simulate rebuilds the n-gram pair and supports n-gram "
                        "traces only")
    t0 = time.perf_counter()
    out.note(f"{info['label']}: rebuilding the draft/target pair of {data_dir / split}.npz")
    pair, same_corpus = _pair_for(ts, out)
    res = simulate.check_rule(pair, ts, rule, split=split, prompts=prompts, blocks=blocks,
                              contexts=contexts, reps=reps, seed=seed, progress=out.note)
    doc = {"rule": info, "data": str(data_dir), "corpus_matches_trace": same_corpus, **res,
           "seconds": round(time.perf_counter() - t0, 3)}
    if json_mode:
        out.print_json(_jsonable(doc))
        return
    views.show_simulation(doc, out)


# -------------------------------------------------------------- tradeoff

@click.command("tradeoff")
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

    Every rule family of the rules table is swept on valid and test; for each
    budget each family is tuned on valid and its test numbers are shown, next
    to the champions of the --run directories."""
    from evolve.data import traces
    from evolve.objectives import spec
    from evolve.rules import tuning
    from evolve.rules.table import families
    from evolve.runs import paths, pictures
    budgets = list(dict.fromkeys(budgets)) or list(DEFAULT_BUDGETS)
    for b in budgets:
        need(math.isfinite(b) and b >= 0, "--budget", b, "a TV per token >= 0")
    need(max_tv is None or max_tv > 0, "--max-tv", max_tv, "a TV per token > 0")
    data_dir = Path(data_dir) if data_dir else default_traces()
    out = term(json_mode)
    extra, infos = {}, []
    parent = paths.runs_dir(runs_dir)
    for r in dict.fromkeys(run_names):
        rule, info = _run_rule(parent, r)
        extra[info["label"]] = rule.nodes
        infos.append(info)
    t0 = time.perf_counter()
    splits = traces.load_splits(data_dir, ("valid", "test"))
    sas = {s: spec.SpecArrays.from_split(ts) for s, ts in splits.items()}
    out.note(f"sweeping {len(families())} rule families on valid and test, tuning to "
              f"{len(budgets)} budget(s) ...")
    res = tuning.tradeoff(sas["valid"], sas["test"], budgets, extra)
    # standard last among the families: drawn over leniency l=1 and ears beta=0 (same point)
    names = [k for k in res["series"] if k in families() and k != "standard_rejection"]
    names += [k for k in res["series"] if k not in names]
    series = {k: [tuple(xy) for xy in res["series"][k]] for k in names}
    png_path = None
    if png is not None:
        try:
            pictures.render_png(series, png, title=f"{data_dir}: test split "
                              f"(g = {res['block_size']}, k = {res['top_k']})")
        except RuntimeError as e:       # matplotlib missing
            fail(f"--png: {e}")
        png_path = str(png)
        out.note(f"{png}: written")
    doc = {"data": str(data_dir), **res, "runs": infos, "png": png_path,
           "seconds": round(time.perf_counter() - t0, 3)}
    if json_mode:
        out.print_json(_jsonable(doc))
        return
    views.show_tradeoff(doc, series, out, max_tv)
