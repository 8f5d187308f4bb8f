"""The one place that owns rich: console, tables, progress.

Results go to stdout, progress and notes to stderr. When stderr is not a
terminal, progress becomes plain lines; ``NO_COLOR`` is honoured (rich reads
it); ``--json`` prints one JSON document on stdout and nothing else there.

Tables keep every character of every cell: when stdout is not a terminal (a file,
a pipe) a table is printed at its natural width, however wide, and a line of text
is never broken; on a terminal too narrow for a table its cells wrap onto further
lines (at spaces, else anywhere) instead of being cut to an ellipsis.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time

# C0/C1 controls, DEL, and the format characters that reorder or hide text
# (bidi overrides, zero-width): never printed as they are.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e"
                      "\u2066-\u2069\ufeff]")


def printable(text, keep_newlines: bool = False) -> str:
    """``text`` with every control character shown as an escape (``\\x1b``, ...):
    whatever a file holds, printing it cannot move the cursor, clear the screen or
    recolour the terminal. Newlines are kept only where the caller's own text
    spans lines."""
    def esc(m):
        ch = m.group(0)
        if keep_newlines and ch == "\n":
            return ch
        code = ord(ch)
        return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
    return _CONTROL.sub(esc, str(text))


# The width of stdout when it is not a terminal: wider than any table, which rich then
# prints at its natural width (tables do not expand; text lines are not padded).
PIPED_WIDTH = 10_000


class Terminal:
    def __init__(self, json_mode: bool = False):
        from rich.console import Console    # lazy: start-up (rich loads only where it is used)
        self.json_mode = json_mode
        # stdout not a terminal: tables at their natural width, text never broken
        self.piped = not sys.stdout.isatty()
        # (notes on stderr: the terminal's width, or COLUMNS, or 160)
        width = None if (sys.stdout.isatty() or os.environ.get("COLUMNS")) else 160
        out_width = PIPED_WIDTH if self.piped else width
        # no markup, emoji codes or highlighting is ever applied to text: what a file
        # holds is printed as it is (after ``printable``)
        self.out = Console(highlight=False, soft_wrap=False, width=out_width, emoji=False,
                           markup=False)
        self.err = Console(stderr=True, highlight=False, width=width, emoji=False,
                           markup=False)

    # --- messages -------------------------------------------------------
    def note(self, text: str) -> None:
        self.err.print(printable(text, keep_newlines=True), markup=False,
                       soft_wrap=True)   # commands stay copyable

    def step(self, text: str) -> None:
        """A step of a long command under way (stderr), as progress is: none with --json."""
        if not self.json_mode:
            self.note(text)

    def error(self, text: str) -> None:
        first = str(text).splitlines()[0] if str(text).strip() else "unknown error"
        self.err.print(f"error: {printable(first)}", markup=False, style="bold red",
                       soft_wrap=True)   # one line, however long

    def result(self, text: str) -> None:
        if not self.json_mode:       # (piped: a long line stays one line)
            self.out.print(printable(text, keep_newlines=True), markup=False)

    def print_json(self, obj) -> None:
        sys.stdout.write(json.dumps(obj, indent=2, allow_nan=False) + "\n")
        sys.stdout.flush()

    # --- tables ---------------------------------------------------------
    def table(self, title: str, columns: list[tuple[str, str]], rows: list[list],
              styles: list[str | None] | None = None) -> None:
        """columns: (header, justify); rows: already formatted cells."""
        if self.json_mode:
            return
        from rich.table import Table    # lazy: start-up (rich loads only where it is used)
        from rich.text import Text    # lazy: start-up (rich loads only where it is used)
        t = Table(title=Text(printable(title)), title_justify="left", show_edge=False,
                  pad_edge=False)
        for header, justify in columns:     # too narrow a terminal: cells wrap, never cut
            t.add_column(Text(printable(header)), justify=justify, overflow="fold")
        for i, row in enumerate(rows):   # Text: a cell's text is never read as markup
            t.add_row(*[Text(printable(c)) for c in row],
                      style=(styles[i] if styles else None))
        self.out.print(t)      # (piped: PIPED_WIDTH, so at the table's natural width)

    # --- progress -------------------------------------------------------
    def progress(self, total: int, start: int = 0):
        return _Progress(self, total, start)

    def meter(self, label: str, total: int, unit: str):
        """A counting bar (``advance(n)``) with the rate in ``unit``/s and the ETA."""
        return _Meter(self, label, total, unit)


class _Meter:
    """Work counted in units (drafted tokens, steps): a live rich bar with the rate, what
    is under way and the ETA on a terminal; otherwise the plain lines of
    ``evolve.api.progress.LineMeter`` (at most one every ``PLAIN_EVERY`` seconds, none
    when the work is done sooner: the caller's own line reports it)."""
    PLAIN_EVERY = 10.0

    def __init__(self, term: Terminal, label: str, total: int, unit: str):
        from evolve.api.progress import LineMeter    # lazy: start-up (a command loads only what it runs)
        self.term, self.label, self.total, self.unit = term, label, max(1, total), unit
        self.live = term.err.is_terminal and not term.json_mode
        self._plain = None if (self.live or term.json_mode) else \
            LineMeter(term.note, label, total, unit, every=self.PLAIN_EVERY)
        self.done = 0
        self.t0 = time.perf_counter()
        self._bar = None

    def __enter__(self):
        if self.live:
            # lazy: start-up (rich loads only where it is used)
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                                       TimeElapsedColumn, TimeRemainingColumn)
            self._bar = Progress(TextColumn(printable(self.label)), MofNCompleteColumn(),
                                 BarColumn(), TextColumn("{task.fields[rate]}"),
                                 TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
                                 TextColumn("{task.fields[what]}"),
                                 console=self.term.err, transient=True)
            self._bar.__enter__()
            self._task = self._bar.add_task(self.label, total=self.total, rate="", what="")
        return self

    def __exit__(self, *exc):
        if self._bar is not None:
            self._bar.__exit__(*exc)
        return False

    def set_total(self, total: int) -> None:
        self.total = max(1, total)
        if self._bar is not None:
            self._bar.update(self._task, total=self.total)
        elif self._plain is not None:
            self._plain.set_total(total)

    def advance(self, n: int = 0, what: str | None = None) -> None:
        self.done += n
        if self._bar is not None:
            rate = self.done / max(time.perf_counter() - self.t0, 1e-9)
            fields = {"rate": f"{rate:,.0f} {self.unit}/s"}
            if what is not None:
                fields["what"] = printable(what)
            self._bar.update(self._task, completed=self.done, **fields)
        elif self._plain is not None:
            self._plain.advance(n, what)


class _Progress:
    """Generation progress: a live rich bar on a terminal, plain lines otherwise (the
    first and last generation, then at most one every 2 s, and every 50th). The ETA
    starts from the first generation reported, not from the start: that generation's
    time holds the kernels' compilation and the data's first pass, which would make
    the first estimates of a short run many times too long; until a second generation
    is done there is none."""

    def __init__(self, term: Terminal, total: int, start: int):
        self.term = term
        self.total = total
        self.start = start
        self.live = term.err.is_terminal and not term.json_mode
        self.last_plain = 0.0
        self.base = None          # (time, generation) of the first record
        self._bar = None

    def __enter__(self):
        if self.live:
            # lazy: start-up (rich loads only where it is used)
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                                       TimeElapsedColumn)
            self._bar = Progress(TextColumn("gen"), MofNCompleteColumn(), BarColumn(),
                                 TextColumn("{task.fields[info]}"), TimeElapsedColumn(),
                                 TextColumn("{task.fields[eta]}"),
                                 console=self.term.err, transient=False)
            self._bar.__enter__()
            self._task = self._bar.add_task("evolve", total=self.total, completed=self.start,
                                            info="", eta="")
        return self

    def __exit__(self, *exc):
        if self._bar is not None:
            self._bar.__exit__(*exc)
        return False

    def eta(self, g: int, now: float) -> float | None:
        """Seconds left at generation ``g``: the time per generation since the first
        record times the generations left (None before a second record)."""
        if self.base is None:
            self.base = (now, g)
            return None
        t0, g0 = self.base
        return None if g <= g0 else (now - t0) / (g - g0) * (self.total - g)

    def update(self, record: dict) -> None:
        g = record["generation"]
        now = time.perf_counter()
        eta = self.eta(g, now)
        eta_text = "eta after the next generation" if eta is None else f"eta {eta:.0f}s"
        info = (f"train {record['best_train']:.4f} (median {record['median_train']:.4f}) "
                f"valid {record['best_valid']:.4f} size {record['mean_size']:.1f} "
                f"{record['timing']['evals_per_s']:.0f} evals/s")
        if self._bar is not None:
            self._bar.update(self._task, completed=g, info=info, eta=eta_text)
            return
        if self.term.json_mode:
            return
        if g in (0, self.total) or now - self.last_plain >= 2.0 or g % 50 == 0:
            self.term.note(f"gen {g}/{self.total} {info} "
                           + ("done" if g == self.total else eta_text))
            self.last_plain = now
