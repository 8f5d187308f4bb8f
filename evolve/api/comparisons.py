"""``evolve.compare``: rules decoded free-running on the same prompts with the same
uniforms, each from its own trajectory, against the first (what ``evolve simulate
--compare`` prints; the numerics are ``evolve.freerun.paired``'s).

    import evolve
    c = evolve.compare(["leniency:0.94", "run:my-run", evolve.Rule.named("ears", 0.05)],
                       data_dir="datasets/traces", prompts=512)
    c.rows                           # one flat record per rule (pandas.DataFrame(c.rows))
    c.difference("run my-run")       # tokens per call minus the reference's, 95% interval

It decodes with the pair that recorded the traces (rebuilt by its source,
``evolve.data.sources.registry``). Sizes beyond the bounds or this machine's memory,
and bad arguments, are one-line errors naming the parameter, before any decoding.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass

from evolve.freerun import paired, simulate
from evolve.api.named import in_scope, rule_of
from evolve.api.progress import LineMeter
from evolve.data import traces
from evolve.data.sources.registry import source_of, source_of_pair
from evolve.errors import EvolveError, show
from evolve.io import paths

SPLIT_NAMES = ("train", "valid", "test")


class CompareError(EvolveError):
    """A comparison asked with an argument of the wrong type or range (one line)."""


@dataclass(frozen=True)
class Comparison:
    """A paired free-running comparison: ``report`` is what ``evolve simulate --compare
    --json`` prints (per rule: tokens per call, TV and KL per token with standard errors
    by sequence, slot TV by position and its 99th percentile, the mean slot TV by
    distance from the prompt (``tv_by_distance``: 0 the answer's first token), the text's
    log-likelihoods; and each rule minus the first, paired by sequence)."""
    report: dict

    @property
    def reference(self) -> str:
        return self.report["reference"]

    @property
    def rows(self) -> list[dict]:
        """One flat record per rule: its numbers, and its paired difference from the
        reference in tokens per call with the 95% interval (None for the reference)."""
        out = []
        for label, r in self.report["rules"].items():
            d = self.report["versus_reference"].get(label, {}).get("tokens_per_call")
            out.append({"rule": label, **{k: v for k, v in r.items()
                                          if not isinstance(v, (list, dict))},
                        "slot_tv_by_position": r.get("slot_tv_by_position"),
                        "tv_by_distance": {k: v["tv"] for k, v in
                                           (r.get("tv_by_distance") or {}).items()},
                        "tokens_difference": None if d is None else d["difference"],
                        "tokens_difference_se": None if d is None else d["se"],
                        "tokens_difference_ci95": None if d is None else d["ci95"]})
        return out

    def difference(self, label: str) -> dict:
        """A rule's paired differences from the reference (tokens per call, TV per
        token, log-likelihoods: difference, se, ci95)."""
        try:
            return self.report["versus_reference"][label]
        except KeyError:
            raise CompareError.of("label", f"{show(label)} is not a compared rule other than "
                                           f"the reference ({', '.join(self.report['versus_reference'])})") \
                from None


def _whole(param: str, value, least: int, optional: bool = True) -> None:
    if value is None and optional:
        return
    if not (isinstance(value, int) and not isinstance(value, bool) and value >= least):
        raise CompareError.of(param, f"{show(value)} is invalid; expected a whole number "
                                     f">= {least}")


def compare(rules, data_dir=None, split: str = "test", prompts: int | None = None,
            blocks: int | None = None, seed: int = 1, runs_dir=None, progress=None,
            meter=None, any_scope: bool = False) -> Comparison:
    """Decode every rule of ``rules`` (at least two; the first is the reference)
    free-running on the same prompts and uniforms of ``split``.

    A rule is a ``Rule``, or text: ``NAME`` or ``NAME:PARAM`` of the rules table, or
    ``run:RUN`` (a run under ``runs_dir``). ``prompts`` (default: the split's) and
    ``blocks`` (default: as recorded) size the decoding; ``seed`` draws the prompts and
    uniforms. ``progress``: a callable given a line per rule decoded and, during one,
    at most every 10 s (``print``); ``meter``: the command line's bar instead.

    A champion (``run:RUN``, a run's ``Rule``) decodes only traces of the scope it was
    scored in (``evolve.api.named.in_scope``): another scope is a one-line ScopeError
    naming both; ``any_scope`` decodes it, its label marked on every row."""
    if isinstance(rules, (str, bytes)) or not hasattr(rules, "__iter__"):
        raise CompareError.of("rules", f"{show(rules)} is invalid; expected a list of at "
                                       "least two rules")
    rules = list(rules)
    if len(rules) < 2:
        raise CompareError.of("rules", f"{show(rules)} is invalid; expected at least two "
                                       "rules")
    if split not in SPLIT_NAMES:
        raise CompareError.of("split", f"{show(split)} is invalid; expected one of "
                                       f"{', '.join(SPLIT_NAMES)}")
    _whole("prompts", prompts, 2)
    _whole("blocks", blocks, 1)
    _whole("seed", seed, 0, optional=False)
    if not isinstance(any_scope, bool):
        raise CompareError.of("any_scope", f"{show(any_scope)} is invalid; expected True or "
                                           "False")
    for name, value, most in (("prompts", prompts, simulate.MAX_PROMPTS),
                              ("blocks", blocks, simulate.MAX_BLOCKS)):
        if value is not None:
            simulate.check_bound(name, value, most)
    say = progress or (lambda text: None)
    if meter is None and progress is not None:
        meter = functools.partial(LineMeter, progress)
    data_dir = traces.trace_dir(data_dir if data_dir is not None else paths.TRACES_DIR)
    ts = traces.load(data_dir / f"{split}.npz", name=split)
    cfg = source_of(ts).config_of(ts)    # sizes checked before the rules' runs or the models
    paired.check_comparison(cfg.prompts(split) if prompts is None else prompts,
                            cfg.blocks_per_prompt if blocks is None else blocks, len(rules),
                            cfg.block_size, cfg.top_k, cfg.context_len, cfg.prompt_len)
    named = {}
    parent = paths.runs_dir(runs_dir)
    scope, outside = traces.scope_of(ts.meta), {}
    for r in rules:
        rule, info = in_scope(*rule_of(r, parent), scope, any_scope)
        named[info["label"]] = rule
        if "outside_scope" in info:
            outside[info["label"]] = info["outside_scope"]
            say(f"evaluated outside its scope: {info['outside_scope']}")
    pair, same_corpus = source_of(ts).pair_of(ts, say)
    src = source_of_pair(pair)
    blocks = cfg.blocks_per_prompt if blocks is None else int(blocks)
    # before any decoding: one line, no output
    prompts = src.prepare_comparison(pair, split, prompts, blocks, meter)
    prompts = cfg.prompts(split) if prompts is None else int(prompts)
    t0 = time.perf_counter()
    try:        # the sizes again, now that an hf prompts file has given its count
        res = paired.compare(pair, named, split=split, prompts=prompts, blocks=blocks,
                             seed=seed, progress=say, meter=meter)
    except simulate.SizeError:
        raise
    except Exception as e:       # out of memory on the models' device while decoding
        why = src.memory_error(pair, e)
        if why is None:
            raise
        raise simulate.SizeError({"prompts": prompts, "blocks": blocks},
                                 f"{why}; ask for fewer prompts or blocks, or record with "
                                 "a smaller batch size") from None
    return Comparison({"data": str(data_dir), "corpus_matches_trace": same_corpus, **res,
                       "outside_scope": outside,
                       "seconds": round(time.perf_counter() - t0, 3)})
