"""Orchestration of one `evolve run`: engine + run directory + signals + write-back."""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from pathlib import Path

from evolve import codegen, data, treeio
from evolve.engine import Config, ConfigError, Evolution
from evolve.runs import RunDir, RunError, check_name, default_name, now_iso

EXIT_INTERRUPTED = 130


@dataclass
class RunOptions:
    config: Config
    data_dir: Path
    runs_parent: Path
    name: str | None = None
    resume: str | None = None
    writeback: bool = True
    force: bool = False
    heuristics_dir: Path | None = None


class StopRequested:
    """SIGINT/SIGTERM: the first asks to stop after the current generation, the
    second exits at once (the last checkpoint is complete on disk either way)."""

    def __init__(self, term):
        self.term = term
        self.requested = False
        self.signal_name = ""
        self._old = {}

    def __enter__(self):
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._old[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)
        return False

    def _handle(self, signum, frame):
        if self.requested:
            os.write(2, b"\nsecond interrupt: exiting now; the last checkpoint is intact\n")
            os._exit(EXIT_INTERRUPTED)
        self.requested = True
        self.signal_name = signal.Signals(signum).name
        os.write(2, b"\ninterrupt: finishing the current generation, then saving "
                    b"(press Ctrl-C again to exit at once)\n")


def _check_writable(parent: Path) -> None:
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise RunError(f"{parent}: cannot create runs directory ({e.strerror})") from None
    if not os.access(parent, os.W_OK):
        raise RunError(f"{parent}: runs directory is not writable")


def prepare(opts: RunOptions):
    """Validate everything and load data before any work; returns (run, splits, engine, state)."""
    _check_writable(opts.runs_parent)
    if opts.resume:
        run = RunDir.open(opts.runs_parent, opts.resume)
        meta = run.meta()
        state = run.checkpoint()
        try:
            cfg = Config.from_dict(meta["config"])
        except TypeError as e:
            raise RunError(f"{run.file('config.json')}: bad config ({e})") from None
        if opts.config.generations != cfg.generations and opts.config.generations > 0:
            cfg.generations = opts.config.generations
        cfg.validate()
        data_dir = Path(meta.get("data", {}).get("dir", opts.data_dir))
        splits = data.load_splits(data_dir)
        engine = Evolution(cfg, splits["train"], splits["valid"])
        try:
            engine.restore(state)
        except (treeio.TreeError, KeyError, TypeError, ValueError) as e:
            raise RunError(f"{run.file('checkpoint.json')}: cannot restore ({e})") from None
        if cfg.to_dict() != meta["config"]:
            run.update_config(cfg.to_dict())
        run.truncate_history(engine.generation)
        return run, splits, engine, data_dir
    opts.config.validate()
    name = check_name(opts.name) if opts.name else default_name(opts.config.seed)
    if (opts.runs_parent / name).exists():
        raise RunError(f"{opts.runs_parent / name}: a run of that name exists "
                       f"(use --resume {name} or another --name)")
    splits = data.load_splits(opts.data_dir)
    engine = Evolution(opts.config, splits["train"], splits["valid"])
    run = RunDir.create(opts.runs_parent, name, opts.config.to_dict(), {
        "dir": str(opts.data_dir.resolve()),
        "tokens": {k: len(v) for k, v in splits.items()},
    })
    return run, splits, engine, opts.data_dir


def execute(opts: RunOptions, term) -> tuple[int, dict]:
    """Run (or resume) evolution; returns (exit code, result dict)."""
    run, splits, engine, data_dir = prepare(opts)
    cfg = engine.config
    resumed = engine.generation >= 0
    with StopRequested(term) as stop:
        try:
            with term.progress(cfg.generations, start=max(engine.generation, 0)) as bar:
                if not resumed:
                    rec = engine.initialise()
                    _save_generation(run, engine, rec)
                    bar.update(rec)
                while engine.generation < cfg.generations and not stop.requested:
                    rec = engine.step()
                    _save_generation(run, engine, rec)
                    bar.update(rec)
        except OSError as e:
            run_summary = {"status": "failed", "generation": engine.generation,
                           "error": f"{e.strerror or e}", "ended": now_iso()}
            _try_summary(run, run_summary)
            raise RunError(f"{run.path}: write failed at generation {engine.generation} "
                           f"({e.strerror or e}); the last good checkpoint is kept") from None
        if stop.requested:
            resume_cmd = f"evolve run --resume {run.name}"
            if Path(opts.runs_parent).resolve() != Path("runs").resolve():
                resume_cmd += f" --runs-dir {opts.runs_parent}"
            summary = {"status": "interrupted", "signal": stop.signal_name,
                       "generation": engine.generation, "resume": resume_cmd,
                       "ended": now_iso()}
            run.write_json("summary.json", summary)
            return EXIT_INTERRUPTED, {"run": run.name, "path": str(run.path), **summary}
    result = finish(run, engine, splits, opts, term)
    return 0, result


def _save_generation(run: RunDir, engine: Evolution, rec: dict) -> None:
    run.append_history(rec)
    if rec["generation"] % engine.config.checkpoint_every == 0 or \
            rec["generation"] == engine.config.generations:
        run.write_checkpoint(engine.state())


def _try_summary(run: RunDir, summary: dict) -> None:
    try:
        run.write_json("summary.json", summary)
    except OSError:
        pass


def finish(run: RunDir, engine: Evolution, splits, opts: RunOptions, term) -> dict:
    """Champion on valid, test once, run files, write-back."""
    from evolve.scoring import PreparedSplit, score
    from evolve.writeback import load_module_from, write_back
    from heuristics.registry import compile_function

    champ = engine.champion()
    nodes = treeio.parse(champ.tree)
    # hall of fame with valid fitness
    hof_valid = engine.valid_scores([e.tree for e in engine.hof.entries])
    run.write_json("hall_of_fame.json", [
        {**{"tree": e.tree, "expression": codegen.infix(treeio.parse(e.tree)),
            "size": e.size, "born": e.born, "train_fitness": e.fitness},
         "valid_fitness": float(v)} for e, v in zip(engine.hof.entries, hof_valid)])

    meta_base = {"run": run.name, "seed": engine.config.seed,
                 "objective": engine.config.objective, "date": now_iso(),
                 "tree": champ.tree, "generation": champ.born}
    # Score with the generated code itself (the path evolve benchmark uses).
    source0 = codegen.module_source(nodes, "evolved", {**meta_base, "metrics": {}},
                                    f"Evolved acceptance heuristic (run {run.name})")
    run.write_text("champion.py", source0)
    mod = load_module_from(run.file("champion.py"), f"_champion_{abs(hash(run.name))}")
    ufunc = compile_function(mod.evolved)
    prepared = {k: PreparedSplit(v) for k, v in splits.items()}
    metrics = {k: score(ufunc, prepared[k]) for k in ("train", "valid", "test")}
    meta = {**meta_base, "metrics": {k: {m: v for m, v in d.items() if m != "eval_ms"}
                                     for k, d in metrics.items()}}
    source = codegen.module_source(nodes, "evolved", meta,
                                   f"Evolved acceptance heuristic (run {run.name})")
    run.write_text("champion.py", source)
    champion = {
        "expression": codegen.infix(nodes),
        "tree": champ.tree,
        "size": len(nodes),
        "depth": treeio.depth(nodes),
        "generation": champ.born,
        "objective": engine.config.objective,
        "metrics": metrics,
    }
    run.write_json("champion.json", champion)
    wb = None
    if opts.writeback:
        wb = write_back(source, metrics["valid"]["fitness"], prepared["valid"], run.name,
                        force=opts.force, directory=opts.heuristics_dir)
    summary = {"status": "finished", "generation": engine.generation, "ended": now_iso(),
               "writeback": wb}
    run.write_json("summary.json", summary)
    return {"run": run.name, "path": str(run.path), "champion": champion,
            "writeback": wb, "status": "finished"}

