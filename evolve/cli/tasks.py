"""``evolve data task`` (task traces with critical-token labels) and ``evolve simulate-task``
(the paired free-running task accuracy of rules: the sibling of ``evolve simulate
--compare`` on tasks)."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import click

from evolve.cli.common import BadOption, doing, fail, friendly_errors, json_option, need, \
    option_message, runs_dir_option, term
from evolve.errors import EvolveError, shorten

MODES = ("greedy", "sample")     # evolve.data.sources.task.record.MODES (tested equal)
BUILT_IN_PROMPTS = {"train_prompts": 1000, "valid_prompts": 300, "test_prompts": 300}


def _default_dir() -> Path:
    from evolve.io.paths import DATA_DIR    # lazy: start-up (a command loads only what it runs)
    return DATA_DIR / "task"


@click.command("task", short_help="Record a task's traces and label its critical drafts.")
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="Directory for train/valid/test and their labels (default: datasets/task).")
@click.option("--decoding", type=str, default="greedy", show_default=True,
              help="greedy (the draft's argmax, kept iff it is the target's) or sample.")
@click.option("--seed", type=int, default=0, show_default=True,
              help="The problems (or the split of a task file), the draft's training and "
                   "the decoding.")
@click.option("--block-size", type=int, default=4, show_default=True, help="Drafts per block.")
@click.option("--top-k", type=int, default=16, show_default=True,
              help="Draft candidates stored per drafted position.")
@click.option("--temperature", type=float, default=1.0, show_default=True,
              help="Applied to both models.")
@click.option("--train-prompts", type=int, default=None,
              help="Problems of train (built-in task: 1000; a task file: the first N of "
                   "its train split, default all).")
@click.option("--valid-prompts", type=int, default=None, help="As --train-prompts (300).")
@click.option("--test-prompts", type=int, default=None, help="As --train-prompts (300).")
@click.option("--task-file", type=click.Path(path_type=Path), default=None,
              help="Your task: JSON lines with prompt, answer and an optional split; "
                   "with --target and --draft.")
@click.option("--target", default=None, metavar="PATH_OR_ID",
              help="Your target model (a Hugging Face directory or hub id).")
@click.option("--draft", default=None, metavar="PATH_OR_ID", help="Your draft model.")
@click.option("--max-new-tokens", type=int, default=256, show_default=True,
              help="Task file: generated tokens per problem at most (the end-of-text token "
                   "ends a text before).")
@click.option("--delimiter", default=None,
              help="Task file: the answer is the line after the last DELIMITER "
                   "(default ####).")
@click.option("--answer-regex", default=None, metavar="REGEX",
              help="Task file: the answer is this pattern's group 'answer' (or group 1) at "
                   "its last match, instead of a delimiter.")
@click.option("--answer-words", is_flag=True,
              help="Task file: the answer is the one of the file's answers (a reference may "
                   "list aliases as a|b) that the text names last as whole words, "
                   "ignoring case; for answers written in a sentence.")
@click.option("--device", default="cpu", show_default=True, help="Task file: cpu, cuda or auto.")
@click.option("--dtype", default="float32", show_default=True,
              help="Task file: float32, float16, bfloat16 or auto.")
@click.option("--batch-size", type=int, default=16, show_default=True,
              help="Task file: problems decoded together.")
@click.option("--stop", multiple=True, metavar="TEXT",
              help="A stop string (repeatable): a generated text ends where one starts, "
                   "and its answer is read from the text before it (recorded with the "
                   "traces; e.g. --stop $'\\n\\nQuestion:' for a base model that runs on).")
@click.option("--max-memory", default=None, metavar="SIZE",
              help="Memory the label miner's batch of continuations may take, e.g. 40GB "
                   "(default: half the free memory of the target's device, measured).")
@click.option("--resume", is_flag=True,
              help="Continue an interrupted recording: keep the traces and the labels "
                   "already mined in --out (same settings) and mine the rest.")
@click.option("--shard", default=None, metavar="I/N",
              help="Mine only the I-th of N runs of problems of every split (one process "
                   "or machine each; implies --resume); the labels are written once every "
                   "run is mined.")
@click.option("--cluster", type=str, default=None, metavar="local:N",
              help="Mine labels on a local Dask cluster of N worker processes.")
@click.option("--scheduler", type=str, default=None, metavar="ADDRESS",
              help="Mine labels on the Dask cluster at ADDRESS (workers see --out).")
@click.option("--force", is_flag=True, help="Overwrite existing task traces.")
@friendly_errors
def data_task(out, decoding, seed, block_size, top_k, temperature, train_prompts,
              valid_prompts, test_prompts, task_file, target, draft, max_new_tokens,
              delimiter, answer_regex, answer_words, device, dtype, batch_size, stop,
              max_memory, resume, shard, cluster, scheduler, force):
    """Record a task: every problem decoded with the standard rule up to its answer, and
    each draft it could reject labelled critical or not. By default the built-in
    arithmetic task and its pair; with --task-file, --target and --draft, your own.
    Labels are mined in parts of problems, each kept as it is done: --resume continues
    an interrupted mining, --shard splits it across processes."""
    # lazy: start-up (a command loads only what it runs)
    from evolve.data.sources.ngram import TraceConfigError
    # lazy: start-up (a command loads only what it runs)
    from evolve.data.sources.task import pair as TP
    from evolve.data.sources.task import record    # lazy: start-up (a command loads only what it runs)
    need(decoding in MODES, "--decoding", decoding, " or ".join(MODES))
    own = dict(zip(("--task-file", "--target", "--draft"), (task_file, target, draft)))
    given = [o for o, v in own.items() if v is not None]
    if given and len(given) < len(own):
        missing = next(o for o in own if o not in given)
        fail(f"{missing}: needed with {' and '.join(given)} (your own task is decoded by "
             "your own pair)")
    if task_file is None:
        ctx = click.get_current_context()
        for name in ("delimiter", "answer_regex", "answer_words", "max_new_tokens", "device",
                     "dtype", "batch_size"):
            if ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE:
                fail(f"--{name.replace('_', '-')}: only with --task-file (it sets how your "
                     "own pair decodes your own task)")
    if delimiter is not None and answer_regex is not None:
        fail("--answer-regex: give --delimiter or --answer-regex, not both")
    if answer_words and (delimiter is not None or answer_regex is not None):
        fail("--answer-words: give --delimiter, --answer-regex or --answer-words, one of them")
    from evolve.data.sources.task import mining    # lazy: start-up (as above)
    memory = None
    if max_memory is not None:
        try:
            memory = mining.parse_memory(max_memory)
        except ValueError as e:
            fail(f"--max-memory: {max_memory!r:.40} is invalid; {e}")
    part = None
    if shard is not None:
        try:
            part = mining.parse_shard(shard)
        except ValueError as e:
            fail(f"--shard: {shard!r:.40} is invalid; {e}")
    if force and (resume or shard is not None):
        fail(f"--force: records everything again; not with {'--resume' if resume else '--shard'}")
    resume = resume or part is not None
    if cluster is not None or scheduler is not None:
        from evolve.cluster.session import check_options    # lazy: Dask only when asked
        check_options(cluster, scheduler)
    from evolve.io.paths import check_creatable    # lazy: start-up (as above)
    out = Path(out) if out else _default_dir()
    check_creatable(out, "out", BadOption)         # before any work: written last
    have = [s for s in ("train", "valid", "test") if (out / f"{s}.npz").exists()]
    if have and not (force or resume):
        fail(f"--out {out}: {have[0]}.npz exists; pass --force to overwrite or --resume to "
             "continue")
    tm = term()
    t0 = time.perf_counter()
    nothing = f"nothing was written to {out}"
    doing(f"building the pair; {nothing}")
    try:
        if task_file is None:
            given = {"train_prompts": train_prompts, "valid_prompts": valid_prompts,
                     "test_prompts": test_prompts}
            counts = {k: BUILT_IN_PROMPTS[k] if v is None else v for k, v in given.items()}
            cfg = TP.TaskPairConfig(seed=seed, block_size=block_size, top_k=top_k,
                                    temperature=temperature, stop=tuple(stop), **counts)
            cfg.validate()
            pair = TP.build_pair(cfg)
            what = "task pair built"
        else:
            # lazy: start-up (torch and transformers load only for your own pair)
            from evolve.data.sources.task import hf_pair
            cfg = hf_pair.HFTaskConfig(
                target=target, draft=draft, task_file=str(task_file), seed=seed,
                block_size=block_size, top_k=top_k, temperature=temperature,
                max_new_tokens=max_new_tokens,
                delimiter=(None if answer_regex is not None or answer_words else
                           "####" if delimiter is None else delimiter),
                answer_regex=answer_regex, answer_words=answer_words,
                train_prompts=train_prompts,
                valid_prompts=valid_prompts, test_prompts=test_prompts, device=device,
                dtype=dtype, batch_size=batch_size, stop=tuple(stop))
            pair = hf_pair.build_pair(cfg)
            what = (f"{task_file}: {sum(len(v) for v in pair.problems.values()):,} problems; "
                    f"{target} and {draft} loaded on {pair.info['device']} (context "
                    f"{pair.context_len} tokens)")
    except TraceConfigError as e:
        fail(f"--{e.field.replace('_', '-')}: {e.detail}")
    if resume:                  # the traces kept must be what these settings record
        from evolve.data import traces    # lazy: start-up (a command loads only what it runs)
        from evolve.data.sources.task import record    # lazy: start-up (as above)
        for split in ("train", "valid", "test"):
            path = out / f"{split}.npz"
            why = path.exists() and record.same_recording(
                traces.read_file_meta(path) or {}, pair, split, decoding)
            if why:
                fail(f"--resume: {path} was recorded with other settings ({why}); pass "
                     "--force to record again")
    recording = ("recording and mining {}; the splits and label parts written so far stay "
                 "in place: continue with --resume")
    doing(recording.format("train"))       # before the note: from it on, train is recorded
    tm.note(f"{what} ({time.perf_counter() - t0:.1f} s); recording {decoding} "
            "decoding and mining labels ...")
    session = backend = None
    if cluster is not None or scheduler is not None:
        from evolve.cluster.mining import DaskMining    # lazy: Dask only when asked
        from evolve.cluster.session import Session    # lazy: Dask only when asked
        session = Session(cluster, scheduler)
        backend = DaskMining(session)
    try:
        for split in ("train", "valid", "test"):
            doing(recording.format(split))
            _record_and_mine(pair, out, split, decoding, seed, resume, memory, part, backend,
                             tm)
    finally:
        if session is not None:
            session.close()


def _record_and_mine(pair, out: Path, split: str, decoding: str, seed: int, resume: bool,
                     memory, part, backend, tm) -> None:
    """One split: its traces recorded and written (or, resuming, those in ``out``, which
    the caller checked), then its labels mined part by part (``mining.mine_split``)."""
    from evolve.data import labels as LB    # lazy: start-up (a command loads only what it runs)
    from evolve.data import traces    # lazy: start-up (a command loads only what it runs)
    from evolve.data.sources.task import mining, record    # lazy: start-up (as above)
    t = time.perf_counter()
    path = out / f"{split}.npz"
    ts = None
    if not (resume and path.exists()):       # (kept traces were checked before)
        ts = record.record_traces(pair, split, decoding, meter=tm.meter)
        out.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(mining.parts_dir(out, split), ignore_errors=True)
        LB.labels_path(out, split).unlink(missing_ok=True)
        traces.save(ts, path)
    miner = mining.Miner(pair, path, memory, ts=ts, seed=seed)
    lpath = LB.labels_path(out, split)
    meta = None
    if lpath.exists():
        meta, _ = LB.read_labels(lpath)
        if meta.get("traces_sha256") != miner.sha:
            meta = None
    if meta is None:
        meta = mining.mine_split(out, miner, part, backend, tm.meter, tm.note)
    else:
        tm.note(f"{split}: labels already mined ({lpath})")
    n = len(miner.ts)
    if meta is None:
        left = len(mining.chunks(miner.problems)) - len(mining.done_parts(out, miner))
        tm.note(f"{split}: {n:,} drafted rows of {miner.problems:,} problems; {left} "
                f"part(s) of {mining.CHUNK} problems still to mine (--shard the others, or "
                "--resume); the labels are written once every part is mined")
        return
    c = meta["mined"]
    tm.note(f"{split}: {n:,} drafted rows of {miner.problems:,} problems; {c['rows']:,} "
            f"labelled, {c['critical']:,} critical ({c.get('target_forward_passes', 0):,} "
            f"target forward passes over {c['target_forward_rows']:,} rows, "
            f"{c['seconds']:.1f} s); {time.perf_counter() - t:.1f} s")


def _task_rule(text: str, runs_parent: Path, greedy: bool, scope: dict, any_scope: bool):
    """A --compare rule: lossless, NAME, NAME:PARAM (in greedy decoding, the rule's
    greedy form: ``evolve.rules.table.Rule.task_tree``) or run:RUN (a champion scored in
    ``scope``, or ``any_scope``: ``evolve.api.named.in_scope``)."""
    # lazy: start-up (a command loads only what it runs)
    from evolve.api.named import in_scope, rule_of
    if text == "lossless":
        return None, {"label": "lossless"}
    rule, info = rule_of(text, runs_parent, param="--compare")
    if greedy and info.get("kind") == "rule":
        rule, info = rule_of(text, runs_parent, param="--compare", greedy=True)
    return in_scope(rule, info, scope, any_scope, "rules")


@click.command("simulate-task", short_help="Paired free-running task accuracy of rules "
                                           "(95% intervals).")
@click.option("--compare", "rules", multiple=True, required=True, metavar="RULE",
              help="lossless, NAME, NAME:PARAM or run:RUN (repeatable; the first is the "
                   "reference).")
@click.option("--data", "data_dir", type=click.Path(path_type=Path), default=None,
              help="Task traces whose pair decodes (default: datasets/task).")
@click.option("--split", default="test", show_default=True)
@click.option("--prompts", type=int, default=None, help="Problems (default: the split's).")
@click.option("--decoding", type=str, default=None,
              help="greedy or sample (default: the traces').")
@runs_dir_option
@click.option("--any-scope", is_flag=True,
              help="Decode a champion in another scope (decoding, draft length, top-k, "
                   "temperature) than it was scored in; refused without it, and its rows then "
                   "say they are outside its scope.")
@json_option
@friendly_errors
def compare_task_cmd(rules, data_dir, split, prompts, decoding, runs_dir, any_scope, json_mode):
    """Paired free-running task accuracy: every rule decodes the same problems with the
    same uniforms up to the answer; accuracy, tokens per call, and differences from the
    first rule with 95% intervals."""
    from evolve.freerun import task_compare    # lazy: start-up (a command loads only what it runs)
    from evolve.cli import views    # lazy: start-up (a command loads only what it runs)
    from evolve.data import traces    # lazy: start-up (a command loads only what it runs)
    # lazy: start-up (a command loads only what it runs)
    from evolve.data.sources.task import pair as TP
    from evolve.io import paths    # lazy: start-up (a command loads only what it runs)
    data_dir = Path(data_dir) if data_dir else _default_dir()
    need(split in ("train", "valid", "test"), "--split", split, "train, valid or test")
    need(decoding is None or decoding in MODES, "--decoding", decoding, " or ".join(MODES))
    need(prompts is None or prompts >= 1, "--prompts", prompts, "a whole number >= 1")
    # lazy: start-up (a command loads only what it runs)
    from evolve.data.sources.task.record import check_task_meta
    meta = traces.read_file_meta(data_dir / f"{split}.npz")
    if not isinstance(meta, dict) or meta.get("backend") != "task":
        fail(f"--data {data_dir}: not task traces (record them with `evolve data task`)")
    check_task_meta(meta, data_dir / f"{split}.npz")     # its decoding, before any work
    from evolve.rules.table import RULES    # lazy: start-up (a command loads only what it runs)
    parent = paths.runs_dir(runs_dir)
    greedy = (decoding or meta.get("decoding")) == "greedy"
    scope = traces.scope_of(meta)
    decoded = traces.scope_of({**meta, "decoding": "greedy" if greedy else "sample"})
    chosen, settings, outside = {}, {}, []
    for text in dict.fromkeys(rules):
        try:
            rule, info = _task_rule(text, parent, greedy, decoded, any_scope)
        except EvolveError as e:
            fail(shorten(option_message(e), 400))
        chosen[info["label"]] = rule
        if "outside_scope" in info:
            outside.append(info["outside_scope"])
        if info.get("setting"):          # an engine's own knob: its settings, as set there
            settings[info["label"]] = (f"{info['engine']}: "
                                       f"{RULES[info['name']].engine_setting(info['param'], scope)}")
    try:
        pair = TP.rebuild(meta)
    except (KeyError, TypeError, ValueError) as e:
        fail(f"{data_dir / split}.npz: meta.json's task config cannot be rebuilt ({e})")
    if prompts is not None and prompts > len(pair.problems[split]):
        fail(f"--prompts: {prompts} is invalid; the {split} split has "
             f"{len(pair.problems[split])} problems")
    out = term(json_mode)
    for why in outside:
        out.note(f"evaluated outside its scope: {why}")
    t0 = time.perf_counter()
    doing(f"decoding the {split} problems; nothing was written (the results print at the end)")
    res = task_compare.compare(pair, chosen, split, prompts, greedy, progress=out.note,
                                meter=out.meter)
    res.update(data=str(data_dir), seconds=round(time.perf_counter() - t0, 1),
               engine_settings=settings, outside_scope=outside)
    if json_mode:
        out.print_json(views.jsonable(res))
        return
    views.show_task_comparison(res, out)
