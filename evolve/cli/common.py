"""What every command shares: one-line errors, interrupts, the terminal, common options.

Ctrl-C ends every command the same way (``friendly_errors``): one line on stderr,
``interrupted: evolve COMMAND: WHAT``, saying what was under way and what was kept or
not written, and exit code 130. A command says what a Ctrl-C would leave as it goes
(``doing``); files that belong together are written together (``together``: a Ctrl-C
meanwhile waits for the block). ``evolve run`` catches the signal itself, to finish
its generation and save (``evolve.runs.runner``), and ends with the same line.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import signal
import sys
import threading
from pathlib import Path

import click

from evolve.errors import EXIT_INTERRUPTED, EvolveError, shorten, show

EXIT_BAD_INPUT = 2
_DOING = "evolve.doing"        # the click context's meta key of ``doing``


def term(json_mode: bool = False):
    from evolve.cli.render import Terminal    # lazy: start-up (a command loads only what it runs)
    return Terminal(json_mode=json_mode)


class BadOption(EvolveError):
    """A bad option or input found by a command itself; one line, exit code 2."""


class _UsageLine(click.ClickException):
    """A usage error click found (a mistyped option, a value of the wrong type, a
    missing argument) shown as every other bad input is: one line, exit code 2."""
    exit_code = 2

    def __init__(self, e: click.UsageError):
        text = " ".join(e.format_message().split())
        m = re.match(r"Invalid value for '([^']+)'(?: / '[^']+')?: (.*)$", text)
        if m:                                # "--generations: 'abc' is not a valid integer"
            text = f"{m.group(1)}: {m.group(2)}"
        path = e.ctx.command_path if e.ctx is not None else None
        super().__init__(text.rstrip(".") + (f" (see {path} --help)" if path else ""))

    def show(self, file=None) -> None:
        click.echo(f"error: {self.message}", err=True)


class Stated(click.Option):
    """An option whose default is not click's (``default=None``, so that a command can
    tell what was given; the default is applied later, e.g. by ``Config``) shown as click
    shows any default, ``[default: 100]``, from its ``stated`` text."""

    def __init__(self, *args, stated: str | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.stated = stated

    def get_help_extra(self, ctx):
        extra = super().get_help_extra(ctx)
        if self.stated is not None:
            extra["default"] = self.stated
        return extra


class OneLineGroup(click.Group):
    """A command group whose commands' usage errors are one line (``_UsageLine``);
    a group called with no command still prints its help."""

    def format_commands(self, ctx, formatter) -> None:
        """The commands, each with its summary whole (its ``short_help``, else the first
        sentence of its help), wrapped rather than cut with "..." as click does."""
        rows = []
        for name in self.list_commands(ctx):
            cmd = self.get_command(ctx, name)
            if cmd is not None and not cmd.hidden:
                rows.append((name, cmd.get_short_help_str(limit=10_000)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def parse_args(self, ctx, args):
        return self._one_line(super().parse_args, ctx, args)

    def invoke(self, ctx):
        return self._one_line(super().invoke, ctx)

    @staticmethod
    def _one_line(call, *args):
        try:
            return call(*args)
        except click.UsageError as e:
            if type(e).__name__ == "NoArgsIsHelpError":     # click >= 8.2: help, not an error
                raise
            raise _UsageLine(e) from None


def fail(message: str):
    """A bad option or input: one line on stderr, exit code 2."""
    raise BadOption(message)


def need(ok: bool, option: str, value, expected: str) -> None:
    if not ok:
        fail(f"{option}: {value!r} is invalid; expected {expected}")


def number(option: str, text: str | None) -> float | None:
    """A number option taken as text (``type=str, metavar="FLOAT"``), so that a value
    that is not a number is one line naming the option, as a value out of range is,
    not click's three-line usage error. None stays None; the range is the caller's."""
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        fail(f"{option}: {show(text)} is invalid; expected a number")


def _command() -> str:
    """The running command as typed: ``evolve data task``."""
    ctx = click.get_current_context(silent=True)
    names = []
    while ctx is not None and ctx.parent is not None:
        names.append(ctx.info_name)
        ctx = ctx.parent
    return " ".join(["evolve", *reversed(names)])


def doing(what: str) -> None:
    """What the command is doing now and what a Ctrl-C would leave ("recording valid;
    nothing was written to OUT"): the line an interrupt prints."""
    ctx = click.get_current_context(silent=True)
    if ctx is not None:
        ctx.meta[_DOING] = what


def interrupted(what: str | None = None):
    """The end of an interrupted command: one line, ``interrupted: evolve COMMAND:
    WHAT`` (default: what ``doing`` last said), and exit code 130."""
    ctx = click.get_current_context(silent=True)
    what = what or (ctx.meta.get(_DOING) if ctx is not None else None) or \
        "stopped before it finished"
    term().note(f"interrupted: {_command()}: {what}")
    sys.exit(EXIT_INTERRUPTED)


@contextlib.contextmanager
def together(what: str, then: str):
    """A block a Ctrl-C does not cut short (``what``: the files written together, which
    belong together): a SIGINT meanwhile is noted, the block finishes, and the command
    then stops as interrupted, saying ``then``. In the main thread only (elsewhere
    Python delivers no signal)."""
    got = []

    def noted(signum, frame):
        got.append(signum)
        os.write(2, f"\ninterrupt: {what} first (they belong together)\n".encode())

    main = threading.current_thread() is threading.main_thread()
    old = signal.signal(signal.SIGINT, noted) if main else None
    try:
        yield
    finally:
        if main:
            signal.signal(signal.SIGINT, old)
    if got:
        interrupted(then)


def friendly_errors(fn):
    """Bad input (``evolve.errors.EvolveError``, any subclass) and a file the system
    refuses (``OSError``) become one line on stderr and exit code 2, no traceback;
    Ctrl-C (``KeyboardInterrupt``) one line saying what was interrupted (``doing``)
    and exit code 130. Anything else is a bug and shows as one (a KeyError included)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except KeyboardInterrupt:
            interrupted()
        except EvolveError as e:
            term().error(option_message(e))
            sys.exit(EXIT_BAD_INPUT)
        except OSError as e:          # (a path of thousands of characters: shortened)
            where = f"{shorten(str(e.filename), 300)}: " if getattr(e, "filename", None) else ""
            term().error(f"{where}{e.strerror or e}")
            sys.exit(EXIT_BAD_INPUT)
    return wrapper


def option_message(e) -> str:
    """An error's line naming the command's option for its parameter (``--budget-kl``
    for ``kl_budget``, ``--runs-dir`` for ``runs_dir``); the message as it is when it
    names no parameter or the command has no option for it."""
    ctx = click.get_current_context(silent=True)
    if isinstance(getattr(e, "options", None), dict) and hasattr(e, "cli_message"):
        return e.cli_message()         # several parameters (sizes): each as --name
    if getattr(e, "param", None) is not None and ctx is not None:
        spelled = "--" + e.param.replace("_", "-")      # a parameter named as its option
        for p in ctx.command.params:
            if p.opts and (p.name == e.param or spelled in p.opts):
                return e.named(p.opts[0])
    return str(e)


def default_data() -> Path:
    from evolve.io.paths import DATA_DIR    # lazy: start-up (a command loads only what it runs)
    return DATA_DIR


def default_traces() -> Path:
    from evolve.io.paths import TRACES_DIR    # lazy: start-up (a command loads only what it runs)
    return TRACES_DIR


data_option = click.option("--data", "data_dir", type=click.Path(path_type=Path), default=None,
                           help="Directory with train/valid/test splits (default: datasets/).")
json_option = click.option("--json", "json_mode", is_flag=True,
                           help="Print one JSON document on stdout.")
def _path_or_empty(ctx, param, value):
    """A path, or "" for an empty value (which commands refuse in one line: Path("")
    would silently mean the current directory)."""
    return None if value is None else (Path(value) if value.strip() else "")


runs_dir_option = click.option("--runs-dir", type=str, callback=_path_or_empty, default=None,
                               help="Where run directories live (default: runs/, or "
                                    "$EVOLVE_RUNS_DIR).")

