"""The errors the library raises for bad input, and the first line of any error.

Every error the library raises for something the user gave it (an option, a
file, a data set, a run directory) is an ``EvolveError``: one line that names
what is wrong (a parameter, a file and field, a row), echoes the value and
says what is expected. It is a ``ValueError``, so ``except ValueError`` keeps
catching it. The command line catches ``EvolveError`` alone (and ``OSError``)
and prints its line with exit code 2; any other exception is a bug and shows
as one, with its traceback.

A message names the library's parameter, never a command-line option: an error
about one parameter is made with ``Class.of(param, detail)`` ("runs_dir: an
empty value is not allowed"), and the command line prints the option it read
that parameter from instead ("--runs-dir: an empty value is not allowed",
``evolve.cli.common.option_message``).

Each concern has its own subclass, defined next to the code that raises it:

- ``evolve.search.config.ConfigError``: a run's configuration;
- ``evolve.data.tokens.DataError``: a data set, split or shard (a task file too);
- ``evolve.data.sources.task.checker.CheckerError``: an answer checker's setting;
- ``evolve.data.sources.ngram.TraceConfigError``,
  ``evolve.data.sources.hf.models.HFTraceError``: recording traces;
- ``evolve.io.paths.RunError``, ``evolve.runs.schema.SchemaError``,
  ``evolve.io.jsonio.JsonError``: run directories and their files;
- ``evolve.lang.treeio.TreeError``: a tree's text;
- ``evolve.rules.adapters.RuleError`` (and ``UnknownRule``): a rule of the table;
- ``evolve.export.modules.ExportError``, ``evolve.export.outfile.OutputError``:
  exports and the files a command writes;
- ``evolve.freerun.simulate.SizeError``: a simulation beyond its bounds;
- ``evolve.cluster.ClusterError``: a cluster that cannot be reached or used
  (also a ``RuntimeError``);
- ``evolve.cli.common.BadOption``: an option a command checks itself;
- ``UnknownName`` (here): a name that is not in a table (also a ``KeyError``).

This module imports nothing of the project, so any module may import it.
"""

from __future__ import annotations
import math


EXIT_INTERRUPTED = 130     # the exit code of a command stopped by Ctrl-C (128 + SIGINT)


class EvolveError(ValueError):
    """Bad input: one line, exit code 2 on the command line. ``param`` is the
    parameter the error is about (None: none in particular, e.g. a file), and
    ``detail`` the message without it."""

    param: str | None = None
    detail: str | None = None

    def __init__(self, message: str = "", param: str | None = None,
                 detail: str | None = None):
        super().__init__(message)
        if param is not None:       # (a subclass may have set them already)
            self.param = param
        if detail is not None:
            self.detail = detail

    @classmethod
    def of(cls, param: str, detail: str):
        """The error about ``param``: "param: detail"."""
        return cls(f"{param}: {detail}", param, detail)

    def named(self, label: str) -> str:
        """The message with the parameter called ``label`` (e.g. its command-line
        option); the message itself when it names no parameter."""
        if self.param is None or self.detail is None:
            return str(self)
        return f"{label}: {self.detail}"


class UnknownName(EvolveError, KeyError):
    """A name that is not in a table (a heuristic, ...). Also a ``KeyError``, as a
    lookup; its text is the message (a KeyError's would be quoted)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def first_line(e: BaseException, limit: int | None = None) -> str:
    """The first line of an error's text (surrounding blank space dropped), at most
    ``limit`` characters; the error's type name when it has no text."""
    text = str(e).strip()
    line = text.splitlines()[0].rstrip() if text else type(e).__name__
    return line if limit is None else line[:limit]


def shorten(text: str, limit: int = 60) -> str:
    """``text`` cut to ``limit`` characters, "..." marking the cut."""
    return text if len(text) <= limit else text[:limit - 3] + "..."


def show(value, limit: int = 60) -> str:
    """The value as a message echoes it: its repr, shortened (an int too long for
    ``repr`` is described)."""
    try:
        return shorten(repr(value), limit)
    except ValueError:              # an int beyond Python's str conversion limit
        return f"an integer of about {int(value.bit_length() * math.log10(2)) + 1} digits"
