"""Feedback on long steps, for the Python API and the command line's plain mode.

A ``LineMeter`` counts work in units (steps, drafted tokens) and hands a line to a
callable (``print``, the terminal's notes) at most every ``every`` seconds: the
label, the work done, what is being done now, the rate and an estimate of the time
left. The command line draws a live bar on a terminal instead
(``evolve.cli.render``) and uses this when stderr is not one.
"""

from __future__ import annotations

import time

EVERY_S = 10.0


class LineMeter:
    """``advance(n, what)`` adds ``n`` units of work done (``what``: the work now under
    way); a line goes to ``say`` at most every ``every`` seconds, none when the work
    ends sooner (the caller's own line reports it then). Also a context manager."""

    def __init__(self, say, label: str, total: int, unit: str, every: float | None = None,
                 clock=time.perf_counter):
        self.say, self.label, self.total, self.unit = say, label, max(1, total), unit
        self.every, self.clock = EVERY_S if every is None else every, clock
        self.done = 0
        self.what = ""
        self.t0 = self.last = clock()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def set_total(self, total: int) -> None:
        self.total = max(1, total)

    def rate(self) -> float:
        return self.done / max(self.clock() - self.t0, 1e-9)

    def advance(self, n: int = 0, what: str | None = None) -> None:
        self.done += n
        if what is not None:
            self.what = what
        now = self.clock()
        if self.say is None or now - self.last < self.every:
            return
        self.last = now
        self.say(self.line(now))

    def line(self, now: float) -> str:
        rate = self.rate()
        eta = (self.total - self.done) / rate if rate > 0 else None
        speed = f"{rate:,.0f}" if rate >= 10 else f"{rate:.2g}"
        return (f"{self.label}: {self.done:,}/{self.total:,} {self.unit}"
                + (f" ({self.what})" if self.what else "")
                + f", {speed} {self.unit}/s, {now - self.t0:.0f} s"
                + (f", eta {eta:.0f} s" if eta is not None else ""))


def steps_meter(meter, say, label: str, total: int):
    """A meter of ``total`` steps: the caller's ``meter(label, total, unit)`` (the
    command line's bar) when given, else a ``LineMeter`` speaking through ``say``."""
    return meter(label, total, "steps") if meter is not None else \
        LineMeter(say, label, total, "steps")
