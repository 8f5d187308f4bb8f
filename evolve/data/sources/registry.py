"""Trace sources by name: one object each, one line here (as ``evolve.tasks.TASKS``).

A trace source records speculative-decoding traces from a draft/target pair
(``evolve data trace --backend NAME``), rebuilds that pair from a split's meta.json,
and decodes free-running with it (``evolve simulate --compare``). Everything that
differs between sources is a method of its ``Source``; the command line and the
paired comparison ask a split's (or a pair's) source and never test its name. A
split names its source in ``meta["backend"]`` ("ngram" when absent).

- ``ngram``: the byte-level n-gram pair built here (``evolve.data.sources.ngram``);
- ``hf``: any Hugging Face draft/target pair (``evolve.data.sources.hf``).

Adding a source: a module that records ``TraceSplit``s, and a ``Source`` here.
"""

from __future__ import annotations

from dataclasses import fields

from evolve.data.sources import hf, ngram, ngram_free
from evolve.data.sources.hf import free as hf_free
from evolve.data.tokens import DataError
from evolve.errors import first_line


class Source:
    """What a trace source provides; the methods raise one-line errors."""

    name = ""
    own: tuple = ()              # options that only this source takes (None: not given)
    shardable = False            # --rows-per-shard records straight into shards
    single_rule_check = False    # `evolve simulate --rule/--run` rebuilds its pair
    loads_models = False         # its build says what it records once its models load
    # a free-running comparison of a rule that reads the lookahead inputs estimates its
    # distortion at this many reached slots, with this many futures per candidate
    # (evolve.data.lookahead_emission)
    lookahead = (2000, 32)

    def config(self, options: dict):
        """The validated recording configuration of `evolve data trace`'s options (every
        option by its configuration field's name); TraceConfigError naming the field."""
        raise NotImplementedError

    def _refuse_others(self, options: dict) -> None:
        for other in SOURCES.values():
            for field in other.own:
                if field not in self.own and options.get(field) is not None:
                    raise ngram.TraceConfigError(field, f"only with --backend {other.name}")

    def build(self, cfg, progress=None, meter=None) -> dict:
        """Record train/valid/test (not written)."""
        raise NotImplementedError

    module = None                # the source's module: its config_of(ts) reads meta.json

    def config_of(self, ts):
        """The configuration a split was recorded with (DataError naming the file)."""
        try:
            return self.module.config_of(ts)
        except (KeyError, TypeError, ValueError) as e:
            raise DataError(f"{self._where(ts)}: meta.json has no usable trace config "
                            f"({e})") from None

    def pair_of(self, ts, note) -> tuple:
        """(the pair that recorded ``ts``, rebuilt; whether its corpus is the recorded
        one); ``note(text)`` gets a warning when it is not."""
        raise NotImplementedError

    def free_running(self, pair, rule, split: str, prompts: int, blocks: int, seed: int,
                     lookahead=None, meter=None) -> dict:
        """One rule decoded free-running (``evolve.freerun.paired.run_rule`` reads the result);
        ``lookahead``: (slots, futures) for a rule that reads the lookahead inputs;
        ``meter``: counts the progress (``evolve.cli.render``), where given."""
        raise NotImplementedError

    def prepare_comparison(self, pair, split: str, prompts, blocks: int, meter=None):
        """The prompts a comparison decodes (None: the configured count), checked before
        any decoding; ``meter`` (``evolve.cli.render``) may count its progress."""
        return prompts

    def memory_error(self, pair, error) -> str | None:
        """What ran out of memory, when ``error`` says the pair's device did (else None)."""
        return None

    def _where(self, ts) -> str:
        return ts.meta.get("source", ts.name)


class NGramSource(Source):
    name = "ngram"
    module = ngram
    shardable = True
    single_rule_check = True

    def config(self, options: dict):
        self._refuse_others(options)
        cfg = ngram.TraceConfig(**{f: options[f] for f in NGRAM_FIELDS if f in options})
        cfg.validate()
        return cfg

    def build(self, cfg, progress=None, meter=None) -> dict:
        return ngram.build_splits(cfg, None, progress=progress)

    def pair_of(self, ts, note) -> tuple:
        cfg = self.config_of(ts)
        try:
            pair = ngram.build_pair(cfg)
        except (KeyError, TypeError, ValueError, IndexError) as e:
            raise DataError(f"{self._where(ts)}: meta.json's trace config cannot be rebuilt "
                            f"({type(e).__name__}: {first_line(e, 200)})") from None
        recorded = (ts.meta.get("models") or {}).get("corpus_crc32")
        same = recorded is None or recorded == pair.corpus.fingerprint()
        if not same:
            note(f"warning: {self._where(ts)} was built from another corpus (another Python "
                 "version?); the rebuilt models differ from the ones that made the traces")
        return pair, same

    def free_running(self, pair, rule, split, prompts, blocks, seed, lookahead=None,
                     meter=None):
        return ngram_free.free_running(pair, rule, split, prompts, blocks, seed, lookahead,
                                       meter)


class HFSource(Source):
    name = "hf"
    module = hf
    lookahead = (300, 8)     # each continuation read after the whole history: slower
    own = ("target", "draft", "prompts_file", "corpus_dir")
    loads_models = True

    def config(self, options: dict):
        self._refuse_others(options)
        for field in ("target", "draft"):
            if options.get(field) is None:
                raise ngram.TraceConfigError(field, "--backend hf needs both --target and "
                                             "--draft (a directory or hub id)")
        cfg = hf.HFTraceConfig(**{f.name: options[f.name] for f in fields(hf.HFTraceConfig)
                                  if f.name in options})
        cfg.validate()
        return cfg

    def build(self, cfg, progress=None, meter=None) -> dict:
        return hf.build_splits(cfg, progress=progress, meter=meter)

    def pair_of(self, ts, note) -> tuple:
        fp = hf_free.load(ts, self._where(ts))
        same = hf_free.corpus_matches(fp, ts)
        if not same:
            note(f"warning: {self._where(ts)} was recorded from another prompt corpus (another "
                 "Python version?); the prompt pools differ from the recorded ones")
        return fp, same

    def prepare_comparison(self, pair, split, prompts, blocks, meter=None):
        pair.meter = meter
        return hf_free.check(pair, split, prompts, blocks)

    def memory_error(self, pair, error) -> str | None:
        from evolve.data.sources.hf import models    # lazy: torch, only on this path
        torch, _ = models.require_libs()
        if not models.out_of_memory(torch, error):
            return None
        return f"out of memory on {pair.pair.device} decoding ({first_line(error, 200)})"

    def free_running(self, pair, rule, split, prompts, blocks, seed, lookahead=None,
                     meter=None):
        # (the pair's own meter counts, set by prepare_comparison)
        return hf_free.free_running(pair, rule, split, prompts, blocks, seed, lookahead)


NGRAM_FIELDS = tuple(f.name for f in fields(ngram.TraceConfig))
SOURCES: dict[str, Source] = {s.name: s for s in (NGramSource(), HFSource())}


def source_of(ts) -> Source:
    """The source that recorded a split (DataError for a name this version lacks)."""
    name = str(ts.meta.get("backend", "ngram"))
    if name not in SOURCES:
        raise DataError(f"{ts.meta.get('source', ts.name)}: field 'backend' is {name!r}; "
                        f"expected one of {', '.join(SOURCES)}")
    return SOURCES[name]


def source_of_pair(pair) -> Source:
    """The source whose pair ``pair`` is (each pair class names its ``source``)."""
    return SOURCES[pair.source]
