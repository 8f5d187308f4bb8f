"""One look per rule, everywhere: the colour and marker of every picture (matplotlib)
and the letter of the terminal's plain-text plots.

Every family of the rules table (``evolve.rules.table``), the headroom and learned
rows of a trade-off, and the series a run draws (its hall of fame, NSGA-II front and
champion) has one fixed ``Style`` here, so a family looks the same in ``evolve
tradeoff``'s terminal plot, ``evolve inspect``'s, ``pareto.png``, ``evolve tradeoff
--png`` and the documentation's figures, and its letter in a terminal legend is the one printed in
the plot. Other series (a run's champion added with ``--run``, the installed rule)
take the ``OTHERS`` in turn. This module imports nothing, so the command line can
read it without loading the rules table.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Style:
    colour: str         # a matplotlib colour
    marker: str         # a matplotlib marker
    letter: str         # the mark of the terminal's plain-text plot


STYLES: dict[str, Style] = {
    "standard_rejection": Style("#000000", "*", "S"),
    "leniency": Style("#1f77b4", "o", "l"),
    "ears": Style("#ff7f0e", "s", "e"),
    "typical_acceptance": Style("#2ca02c", "^", "t"),
    "bild_rollback": Style("#800000", "v", "b"),
    "cactus": Style("#9467bd", "D", "c"),
    "fuzzy_sd": Style("#8c564b", "P", "f"),
    "hf_ensemble": Style("#e377c2", "X", "h"),
    "sglang_acc": Style("#7f7f7f", "<", "a"),
    "sglang_single": Style("#bcbd22", ">", "g"),
    "position_leniency": Style("#17becf", "h", "p"),
    "kl_judge": Style("#393b79", "p", "j"),
    "trtllm_relaxed": Style("#637939", "H", "r"),
    "learned_judge": Style("#c000c0", "8", "L"),
    "value_gate": Style("#00008b", "s", "v"),
    "value_gate_ahead": Style("#006400", "D", "A"),
    "knapsack_oracle": Style("#9a9a9a", "d", "k"),
    "hall of fame": Style("#6b6b6b", ".", "."),
    "evolved front (NSGA-II)": Style("#008080", "1", "n"),
    "champion": Style("#e41a1c", "*", "C"),
}

# Series that are not in STYLES (a run's champion, the installed rule), in turn.
OTHERS = (Style("#b2182b", "*", "1"), Style("#1b7837", "p", "2"),
          Style("#762a83", "8", "3"), Style("#b35806", "H", "4"),
          Style("#2166ac", "d", "5"), Style("#8e0152", "x", "6"))


def styles_of(names) -> dict[str, Style]:
    """The style of each series name, in order: its own, or the next of ``OTHERS``."""
    out, extra = {}, 0
    for name in names:
        if name in STYLES:
            out[name] = STYLES[name]
        else:
            out[name] = OTHERS[extra % len(OTHERS)]
            extra += 1
    return out
