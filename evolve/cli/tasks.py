"""``evolve data task`` (task traces with critical-token labels) and ``evolve simulate-task``
(the paired free-running task accuracy of rules: the sibling of ``evolve simulate
--compare`` on tasks)."""

from __future__ import annotations

import time
from pathlib import Path

import click

from evolve.cli.common import fail, friendly_errors, json_option, need, option_message, \
    runs_dir_option, term
from evolve.errors import EvolveError, shorten

MODES = ("greedy", "sample")     # evolve.data.sources.task.record.MODES (tested equal)


def _default_dir() -> Path:
    from evolve.io.paths import DATA_DIR    # lazy: start-up (a command loads only what it runs)
    return DATA_DIR / "task"


@click.command("task")
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
@click.option("--device", default="cpu", show_default=True, help="Task file: cpu, cuda or auto.")
@click.option("--dtype", default="float32", show_default=True,
              help="Task file: float32, float16, bfloat16 or auto.")
@click.option("--batch-size", type=int, default=16, show_default=True,
              help="Task file: problems decoded together.")
@click.option("--force", is_flag=True, help="Overwrite existing task traces.")
@friendly_errors
def data_task(out, decoding, seed, block_size, top_k, temperature, train_prompts,
              valid_prompts, test_prompts, task_file, target, draft, max_new_tokens,
              delimiter, answer_regex, device, dtype, batch_size, force):
    """Record a task: every problem decoded with the standard rule up to its answer, and
    each draft it could reject labelled critical or not. By default the built-in
    arithmetic task and its pair; with --task-file, --target and --draft, your own."""
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
        for name in ("delimiter", "answer_regex", "max_new_tokens", "device", "dtype",
                     "batch_size"):
            if ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE:
                fail(f"--{name.replace('_', '-')}: only with --task-file (it sets how your "
                     "own pair decodes your own task)")
    if delimiter is not None and answer_regex is not None:
        fail("--answer-regex: give --delimiter or --answer-regex, not both")
    out = Path(out) if out else _default_dir()
    if out.exists() and not out.is_dir():
        fail(f"--out {out}: exists and is not a directory")
    have = [s for s in ("train", "valid", "test") if (out / f"{s}.npz").exists()]
    if have and not force:
        fail(f"--out {out}: {have[0]}.npz exists; pass --force to overwrite")
    tm = term()
    t0 = time.perf_counter()
    try:
        if task_file is None:
            counts = {"train_prompts": train_prompts or 1000,
                      "valid_prompts": valid_prompts or 300, "test_prompts": test_prompts or 300}
            cfg = TP.TaskPairConfig(seed=seed, block_size=block_size, top_k=top_k,
                                    temperature=temperature, **counts)
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
                delimiter=None if answer_regex is not None else (delimiter or "####"),
                answer_regex=answer_regex, train_prompts=train_prompts,
                valid_prompts=valid_prompts, test_prompts=test_prompts, device=device,
                dtype=dtype, batch_size=batch_size)
            pair = hf_pair.build_pair(cfg)
            what = (f"{task_file}: {sum(len(v) for v in pair.problems.values()):,} problems; "
                    f"{target} and {draft} loaded on {pair.info['device']} (context "
                    f"{pair.context_len} tokens)")
    except TraceConfigError as e:
        fail(f"--{e.field.replace('_', '-')}: {e.detail}")
    tm.note(f"{what} ({time.perf_counter() - t0:.1f} s); recording {decoding} "
            "decoding and mining labels ...")
    recorded = {}
    for split in ("train", "valid", "test"):      # all recorded before any file is written
        t = time.perf_counter()
        recorded[split] = ts = record.record_split(pair, split, decoding, seed,
                                                          meter=tm.meter)
        c = ts.labels_meta["mined"]
        tm.note(f"{split}: {len(ts):,} drafted rows of {len(pair.problems[split]):,} "
                f"problems; {c['rows']:,} labelled, {c['critical']:,} critical "
                f"({c.get('target_forward_passes', 0):,} target forward passes over "
                f"{c['target_forward_rows']:,} rows, {c['seconds']:.1f} s); "
                f"{time.perf_counter() - t:.1f} s")
    out.mkdir(parents=True, exist_ok=True)
    for ts in recorded.values():
        record.save(ts, out)
    tm.note(f"{out}: train, valid and test traces and their labels written")


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


@click.command("simulate-task")
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
                   "temperature) than it was scored in; refused without it, and its rows are "
                   "marked [outside its scope].")
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
    meta = traces.read_file_meta(data_dir / f"{split}.npz")
    if not isinstance(meta, dict) or meta.get("backend") != "task":
        fail(f"--data {data_dir}: not task traces (record them with `evolve data task`)")
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
    res = task_compare.compare(pair, chosen, split, prompts, greedy, progress=out.note,
                                meter=out.meter)
    res.update(data=str(data_dir), seconds=round(time.perf_counter() - t0, 1),
               engine_settings=settings, outside_scope=outside)
    if json_mode:
        out.print_json(views.jsonable(res))
        return
    views.show_task_comparison(res, out)
