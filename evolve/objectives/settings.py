"""An objective's settings, each declared once, by the objective that reads it.

A ``Setting`` is everything the rest of the program needs to know of one: its name
(the ``Config`` field and the ``evolve.run`` keyword), default, range, the ``evolve run``
option, its help, what a bad value is told it must be, and the key champion metadata
records it under. An objective lists its settings (``Objective.settings``), and its
module declares them, so a new objective with a budget is one module and one line
of ``evolve.objectives.OBJECTIVES``. From these declarations, and nowhere else:

- ``evolve.search.config.Config`` gets its fields, defaults and range checks;
- ``evolve run`` gets its options (``evolve.cli.runs``), ``evolve.run`` its keywords
  and their docstring (``evolve.api.runs``);
- a champion's ``champion.json`` and its module's ``METADATA`` record the settings of
  the objective that made it (``champion_settings``, ``metadata_keys``).

This module imports nothing (the command line builds its options from it without
loading numpy's users or Numba).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Setting:
    """One setting of one or more objectives.

    ``name``: the ``Config`` field and ``evolve.run`` keyword; ``default``: its value
    when not given (its type is the setting's kind: float, int or bool); ``low`` and
    ``high``: the range allowed, both included; ``flag``: the ``evolve run`` option;
    ``help``: what it is, for ``--help`` and ``help(evolve.run)``; ``expect``: what a
    value must be, in the one-line error naming the setting; ``meta``: the key under
    which a champion's metadata records it (None: not recorded); ``off``: a value
    that means "not set" (a cap of 1 is no cap), not recorded in metadata, and
    ``off_text`` what ``--help`` says of it."""
    name: str
    default: float | int | bool
    low: float
    high: float
    flag: str
    help: str
    expect: str
    meta: str | None = None
    off: float | int | bool | None = None
    off_text: str = ""

    @property
    def kind(self) -> str:
        """The kind of value (``Config.kinds``): the type name of the default."""
        return type(self.default).__name__

    def in_range(self, value) -> bool:
        return self.low <= value <= self.high

    def stated_default(self) -> str:
        """The default as ``--help`` states it: ``[0.02]``, ``[1, no cap]``."""
        text = f"{self.default:g}" if isinstance(self.default, float) else str(self.default)
        return f"[{text}, {self.off_text}]" if self.off_text else f"[{text}]"

    def recorded(self, value) -> bool:
        """Whether a champion's metadata records ``value`` (it has a key and is set)."""
        return self.meta is not None and (self.off is None or value != self.off)


def union(objectives) -> tuple:
    """Every setting of ``objectives``, each once, in the order first declared; two
    different declarations of one name are refused (a setting is declared once)."""
    out: dict[str, Setting] = {}
    for objective in objectives:
        for s in objective.settings:
            if out.setdefault(s.name, s) is not s:
                raise TypeError(f"setting {s.name!r} is declared twice, differently "
                                f"(objective {objective.name})")
    return tuple(out.values())


def readers(setting: Setting, objectives) -> list:
    """The names of the objectives that read ``setting``, each once, in order."""
    return list(dict.fromkeys(o.name for o in objectives if setting in o.settings))


def option_help(setting: Setting, objectives, default: bool = True) -> str:
    """``--help`` of a setting's option: who reads it, what it is, its default (with
    ``default``)."""
    names = readers(setting, objectives)
    who = f"Objective{'s' if len(names) > 1 else ''} {', '.join(names)}"
    return f"{who}: {setting.help}" + (f" {setting.stated_default()}." if default else ".")


def champion_settings(objective, config) -> dict:
    """What a champion of ``objective`` records of ``config``: each of its settings
    that has a metadata key and is set, by that key, in declaration order."""
    return {s.meta: getattr(config, s.name) for s in objective.settings
            if s.recorded(getattr(config, s.name))}


def metadata_keys(objectives) -> tuple:
    """Every key a champion's metadata may record a setting under, each once."""
    return tuple(dict.fromkeys(s.meta for s in union(objectives) if s.meta is not None))
