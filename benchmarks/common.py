"""What the benchmark scripts share.

Every script runs as a module from the checkout's root (``python -m benchmarks.speed.harness``),
so ``evolve`` is imported from this checkout and the scripts import each other as a package:
nothing here or in them edits ``sys.path``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]      # the checkout
BENCH = ROOT / "benchmarks"
PAGES = ROOT / "docs"                            # the results pages the experiments rewrite


def module_command(module: str, *args) -> list[str]:
    """The command line that runs the benchmark module ``module`` (e.g.
    ``benchmarks.speed.deap_reference``) with ``args`` in a fresh interpreter; run it with
    ``cwd=ROOT`` or :func:`child_env`."""
    return [sys.executable, "-m", module, *map(str, args)]


def child_env(env: dict | None = None) -> dict:
    """``env`` (default: this process's) with the checkout first on ``PYTHONPATH``, for a
    child process that imports ``evolve`` or ``benchmarks`` from another directory."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def one_line(e: BaseException, limit: int = 160) -> str:
    """An exception as the one line a benchmark's table or JSON names it by: its type
    and the first line of its message, cut to ``limit`` characters."""
    return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:limit]}"


def minutes(seconds: float) -> str:
    """A study's time as its page states it: "under a minute", "1 minute", "12 minutes"."""
    m = round(float(seconds) / 60)
    return "under a minute" if m < 1 else f"{m} minute{'' if m == 1 else 's'}"


def results_page(section: str, docs: Path = PAGES) -> Path:
    """The one page of ``docs`` (``results.md`` and ``results/*.md``) that holds the
    markers of ``section``."""
    begin = f"<!-- {section}:begin -->"
    found = [p for p in [docs / "results.md", *sorted((docs / "results").glob("*.md"))]
             if p.is_file() and begin in p.read_text()]
    if len(found) != 1:
        raise SystemExit(f"{docs}: the markers {begin} ... are on {len(found)} results pages, "
                         "not one")
    return found[0]


def write_section(text: str, section: str, path: Path | None = None) -> None:
    """Replace the text of the results page holding ``<!-- section:begin -->`` and
    ``<!-- section:end -->`` (``path``, or :func:`results_page`) between the markers by
    ``text`` (the results tables an experiment renders)."""
    path = path or results_page(section)
    page = path.read_text()
    begin, end = f"<!-- {section}:begin -->", f"<!-- {section}:end -->"
    if begin not in page or end not in page:
        raise SystemExit(f"{path}: the markers {begin} ... {end} are missing")
    head, rest = page.split(begin, 1)
    tail = rest.split(end, 1)[1]
    path.write_text(head + begin + "\n" + text + "\n" + end + tail)


def publish(doc: dict, out: Path, markdown, section: str, page: bool) -> int:
    """Write an experiment's report ``doc`` to ``out`` as JSON, its markdown to the
    results page's ``section`` where ``page`` says so, and print the markdown."""
    out.write_text(json.dumps(doc, indent=1) + "\n")
    text = markdown(doc)
    if page:
        write_section(text, section)
    print(text)
    return 0
