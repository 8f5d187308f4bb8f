"""Feedback on long steps, for the Python API and the command line's plain mode.

A ``LineMeter`` counts work in units (steps, drafted tokens) and hands a line to a
callable (``print``, the terminal's notes) at most every ``every`` seconds: the
label, the work done, what is being done now, the rate and an estimate of the time
left. ``GenerationLines`` does the same for a run's generations (``evolve.run(progress=
print)``). The command line draws a live bar on a terminal instead
(``evolve.cli.render``) and uses these when stderr is not one.

Why not a library: rich's progress bar (which the command line draws) renders on a
terminal only, and tqdm, the usual choice elsewhere, would add a dependency to print a
line every few seconds; these are that line and its clock, tested with a fake one.
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


class GenerationLines:
    """A run's progress as lines for ``say``: the first and last generation, then at
    most one every ``EVERY`` seconds, and every 50th. The ETA starts from the first
    generation reported, not from the start: that generation's time holds the kernels'
    compilation and the data's first pass, which would make the first estimates of a
    short run many times too long; until a second generation is done there is none."""
    EVERY = 2.0

    def __init__(self, say, total: int, clock=None):
        self.say, self.total, self.clock = say, total, clock or time.perf_counter
        self.base = None          # (time, generation) of the first record
        self.last = 0.0

    def eta(self, g: int, now: float) -> float | None:
        """Seconds left at generation ``g``: the time per generation since the first
        record times the generations left (None before a second record)."""
        if self.base is None:
            self.base = (now, g)
            return None
        t0, g0 = self.base
        return None if g <= g0 else (now - t0) / (g - g0) * (self.total - g)

    @staticmethod
    def info(record: dict) -> str:
        """A generation record in words: best and median train, best valid, size, rate."""
        return (f"train {record['best_train']:.4f} (median {record['median_train']:.4f}) "
                f"valid {record['best_valid']:.4f} size {record['mean_size']:.1f} "
                f"{record['timing']['evals_per_s']:.0f} evals/s")

    @staticmethod
    def eta_text(eta: float | None) -> str:
        return "eta after the next generation" if eta is None else f"eta {eta:.0f}s"

    def update(self, record: dict) -> tuple[str, str]:
        """Take a generation's record; say its line when one is due. Returns (info, eta
        text), for a caller that shows them otherwise (a live bar)."""
        g = record["generation"]
        now = self.clock()
        eta = self.eta_text(self.eta(g, now))
        info = self.info(record)
        if self.say is not None and (g in (0, self.total) or now - self.last >= self.EVERY
                                     or g % 50 == 0):
            self.say(f"gen {g}/{self.total} {info} "
                     + ("done" if g == self.total else eta))
            self.last = now
        return info, eta
