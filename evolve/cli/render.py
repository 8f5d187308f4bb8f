"""The one place that owns rich: console, tables, progress.

Results go to stdout, progress and notes to stderr. When stderr is not a
terminal, progress becomes plain lines; ``NO_COLOR`` is honoured (rich reads
it); ``--json`` prints one JSON document on stdout and nothing else there.

Tables fit the width they are printed to: the terminal's, or when stdout is not a
terminal (a file, a pipe) ``COLUMNS`` if it is set, else ``PIPED_WIDTH`` (120). A table
wider than that wraps its cells onto further lines (at spaces, else anywhere), so every
digit is kept; only a column declared ``"cut"`` (a formula, whole in ``--json``) is
shortened with an ellipsis. No line of a table ends in padding. A line of text
(``result``) is never broken when piped: commands and settings stay copyable.
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


# The width tables fit when stdout is not a terminal and COLUMNS is not set.
PIPED_WIDTH = 120
# The width text lines are laid out in when piped: wider than any line, so that rich
# never breaks one (text lines are not padded).
TEXT_WIDTH = 10_000


def piped_width() -> int:
    """The width a table fits when stdout is not a terminal: ``COLUMNS`` when it holds
    a width, else ``PIPED_WIDTH``."""
    try:
        cols = int(os.environ.get("COLUMNS", ""))
    except ValueError:
        return PIPED_WIDTH
    return cols if cols >= 20 else PIPED_WIDTH


# A cell up to this long (a number with its error, a rule's name) is kept on one line
# when the table can be fitted so; a longer one (a note) wraps at its spaces.
WHOLE_CELL = 20
# A cut column is given this much before cells wrap to make room (a short formula
# whole), and less only when nothing else fits.
CUT_LEAST = 24
# The separator between two columns (" │ ": no edge, no padding at the edges).
SEPARATOR = 3


def _words(text: str) -> int:
    from rich.cells import cell_len    # lazy: start-up (rich loads only where it is used)
    return max((cell_len(w) for w in str(text).split()), default=0)


def fit_widths(columns: list[tuple], rows: list[list], width: int) -> list[int] | None:
    """The content width of each column so that the table fits ``width``, or None when it
    fits at its natural width (or cannot be fitted without breaking words: rich's own
    layout then). Every column first gets its least width: its header's longest word,
    and each cell whole up to ``WHOLE_CELL`` characters (a longer cell's longest word);
    a cut column ``CUT_LEAST`` characters (8 when the table cannot fit so). When even
    that is too wide, the last columns (notes) give up keeping short cells whole first.
    What is left goes to the columns that need least to be whole (a header that would
    wrap, first), each a fair share at most; cut columns last."""
    from rich.cells import cell_len    # lazy: start-up (rich loads only where it is used)
    n = len(columns)
    cut = [len(c) > 2 and c[2] == "cut" for c in columns]
    natural = [max([cell_len(str(c[0]))] + [cell_len(str(r[i])) for r in rows])
               for i, c in enumerate(columns)]
    room = width - SEPARATOR * (n - 1)
    if sum(natural) <= room:
        return None
    whole, words = [], []          # a column's least width with short cells whole, or not
    for i, c in enumerate(columns):
        if cut[i]:       # a cut column: room for a short formula, else a few characters
            whole.append(max(_words(c[0]), min(natural[i], CUT_LEAST)))
            words.append(max(_words(c[0]), min(natural[i], 8)))
            continue
        whole.append(max([_words(c[0])] + [cell_len(str(r[i])) if cell_len(str(r[i])) <=
                                           WHOLE_CELL else _words(r[i]) for r in rows]))
        words.append(max([_words(c[0])] + [_words(r[i]) for r in rows]))
    # too little room for every short cell whole: the last columns (notes) wrap first
    least = next((whole[:k] + words[k:] for k in range(n, -1, -1)
                  if sum(whole[:k]) + sum(words[k:]) <= room), None)
    if least is None:
        return None
    widths = list(least)
    spare = room - sum(widths)
    for group in ([i for i in range(n) if not cut[i]], [i for i in range(n) if cut[i]]):
        todo = sorted(group, key=lambda i: natural[i] - widths[i])    # least need first
        while todo and spare > 0:
            i = todo.pop(0)          # whole if it fits in a fair share of what is left
            give = min(natural[i] - widths[i], max(1, spare // (len(todo) + 1)))
            widths[i] += give
            spare -= give
    return widths


class Terminal:
    def __init__(self, json_mode: bool = False):
        from rich.console import Console    # lazy: start-up (rich loads only where it is used)
        self.json_mode = json_mode
        # stdout not a terminal: tables fit piped_width(), text is never broken
        self.piped = not sys.stdout.isatty()
        # (notes on stderr: the terminal's width, or COLUMNS, or 160)
        width = None if (sys.stdout.isatty() or os.environ.get("COLUMNS")) else 160
        out_width = TEXT_WIDTH if self.piped else width
        self.table_width = piped_width() if self.piped else None
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
    def table(self, title: str, columns: list[tuple], rows: list[list],
              styles: list[str | None] | None = None) -> None:
        """columns: (header, justify) or (header, justify, "cut"): a cut column's cells
        stay on one line, shortened with an ellipsis when the table is too wide (only for
        text printed whole elsewhere, ``--json``); rows: already formatted cells."""
        if self.json_mode:
            return
        from rich.table import Table    # lazy: start-up (rich loads only where it is used)
        from rich.text import Text    # lazy: start-up (rich loads only where it is used)
        t = Table(title=Text(printable(title)), title_justify="left", show_edge=False,
                  pad_edge=False)
        widths = fit_widths(columns, [[printable(c) for c in r] for r in rows],
                            self.table_width or self.out.width)
        for i, (header, justify, *how) in enumerate(columns):   # too narrow: cells wrap
            cut = how == ["cut"]                                 # (or a cut one is cut)
            t.add_column(Text(printable(header)), justify=justify,
                         overflow="ellipsis" if cut else "fold", no_wrap=cut,
                         width=None if widths is None else widths[i])
        for i, row in enumerate(rows):   # Text: a cell's text is never read as markup
            t.add_row(*[Text(printable(c)) for c in row],
                      style=(styles[i] if styles else None))
        # rendered, then written without the padding that ends its lines
        with self.out.capture() as cap:
            self.out.print(t, width=self.table_width)
        self.out.file.write("\n".join(ln.rstrip() for ln in cap.get().split("\n")))
        self.out.file.flush()

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
    """Generation progress: a live rich bar on a terminal, plain lines otherwise
    (``evolve.api.progress.GenerationLines``: the first and last generation, then at
    most one every 2 s, and every 50th; the ETA from the first generation reported)."""

    def __init__(self, term: Terminal, total: int, start: int):
        from evolve.api.progress import GenerationLines    # lazy: start-up (as above)
        self.term = term
        self.total = total
        self.start = start
        self.live = term.err.is_terminal and not term.json_mode
        plain = not self.live and not term.json_mode
        self.lines = GenerationLines(term.note if plain else None, total)
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

    def update(self, record: dict) -> None:
        info, eta = self.lines.update(record)
        if self._bar is not None:
            self._bar.update(self._task, completed=record["generation"], info=info, eta=eta)
