"""``evolve.export(...)``: a champion as a module that needs nothing of this project (numpy,
torch, transformers, vLLM), or as a patch for vLLM (what ``evolve export`` writes).

    import evolve
    e = evolve.export("my-run", format="hf", out="rule_hf.py")   # a run's champion
    e = evolve.export(installed="trace", format="numpy")         # the installed rule
    print(e.source)

``run`` is a run name under ``runs_dir``, a run directory's path, a RunResult or an
``evolve.Rule`` (anything with ``export_metadata()``); ``installed`` (``trace`` or ``tokens``) exports the installed rule instead.
Without ``out`` nothing is written (``source`` holds the text). A champion marked
infeasible is refused unless ``allow_infeasible``. Errors are one line naming the
parameter, and the file is written last, after every check.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from evolve.errors import show
from evolve.export import champions
from evolve.export.modules import (FORMATS, PATCHES, ExportError, check_decoding, check_format,
                                   export_source)
from evolve.export.outfile import check_target, write_new
from evolve.export.vllm_patch import patch_source
from evolve.io import paths

ALL_FORMATS = FORMATS + PATCHES


@dataclass(frozen=True)
class Export:
    """An export: its ``source`` text, ``format``, the file written (``path``, None when
    none was asked for), the replaced file's kept copy (``kept``) and ``notes`` (a
    champion that loses to standard rejection says so)."""
    source: str
    format: str
    path: Path | None = None
    kept: Path | None = None
    notes: list = field(default_factory=list)
    title: str = ""
    metadata: dict = field(default_factory=dict)


def _champion(run, installed, runs_dir) -> tuple:
    """(nodes, metadata, title) of what is exported."""
    if hasattr(run, "export_metadata"):             # an evolve.Rule
        return run.nodes, run.export_metadata(), f"Acceptance rule {run.name}"
    if installed is not None:
        return champions.from_installed(installed)
    return champions.from_run(paths.runs_dir(runs_dir), str(getattr(run, "path", run)))


def export(run=None, *, installed: str | None = None, format: str = "numpy", out=None,
           force: bool = False, allow_infeasible: bool = False, runs_dir=None) -> Export:
    """The module (or patch) of a run's champion, a Rule, or the installed rule, in
    ``format`` (numpy, torch, hf, vllm or vllm-patch); written to ``out`` when given
    (a new file; ``force`` replaces one, keeping it as <name>.previous)."""
    if format not in ALL_FORMATS:
        raise ExportError.of("format", f"{show(format)} is invalid; expected one of "
                                       f"{', '.join(ALL_FORMATS)}")
    if (run is None) == (installed is None):
        raise ExportError("give one of RUN or --installed (run or installed)")
    if installed is not None and installed not in champions.INSTALLED:
        raise ExportError.of("installed", f"{show(installed)} is invalid; expected trace or "
                                          "tokens")
    if force and out is None:
        raise ExportError.of("force", "only with --out (out), the file to write")
    if out is not None:      # before anything is read: the file is written last
        out = check_target("out", out, force=force,
                           refuse_under=(paths.heuristics_dir(),
                                         paths.PACKAGE_ROOT / "heuristics"))
    nodes, meta, title = _champion(run, installed, runs_dir)
    st = meta.get("standing") or {}
    if st.get("verdict") == "infeasible" and not allow_infeasible:
        raise ExportError(f"{title}: the champion is infeasible: {st.get('why')} "
                          "(--allow-infeasible exports it anyway)")
    notes = [f"note: the champion loses: {st.get('why')}"] if st.get("verdict") == "loses" \
        else []
    try:
        check_format(format, nodes)
        check_decoding(format, meta.get("scope"))
        source = patch_source(nodes, meta, title) if format in PATCHES else \
            export_source(nodes, format, meta, title)
    except (TypeError, ValueError) as e:        # metadata that is not plain JSON
        if isinstance(e, ExportError):
            raise
        raise ExportError(f"{title}: cannot export its metadata ({e})") from None
    kept = None
    if out is not None:
        kept = write_new("out", out, source.encode("utf-8"), force)
    return Export(source, format, out, kept, notes, title, meta)
