"""Generate heuristics/baselines.py from the rules table.

    python -m evolve.rules.source            # print the module
    python -m evolve.rules.source --write    # write heuristics/baselines.py

Every rule on the six token features becomes a plain scalar function with the
reference signature (at its default parameter), built by the same code
generation as an evolved champion; ``tests/test_rules.py`` checks that the
committed file is what this prints.
"""

from __future__ import annotations

import sys

from evolve.lang import codegen, treeio
from evolve.objectives.base import TOKENS
from evolve.rules.table import rules
from evolve.io.atomic import atomic_write_text
from evolve.io.paths import PACKAGE_HEURISTICS


def function_name(name: str) -> str:
    return name.replace(".", "_")


def module_text() -> str:
    funcs, helpers, names = [], set(), []
    for r in rules(TOKENS):
        nodes = treeio.parse(r.tree())
        helpers.update(codegen.helpers_used(nodes))
        doc = r.doc + (f" ({r.param} = {r.default:g})" if r.param else "")
        funcs.append(codegen.function_source(nodes, function_name(r.name), doc=doc))
        names.append(r.name)
    registry = "\n".join(f"    {n!r}: {function_name(n)}," for n in names)
    return ('"""Baseline acceptance rules as plain scalar functions (generated).\n\n'
            "Generated from the rules table (evolve/rules/table.py) by\n"
            "`python -m evolve.rules.source --write`; do not edit by hand. Each takes the\n"
            "reference signature and returns the threshold; a token is accepted iff\n"
            "rand_value < threshold. ``heuristics.registry`` compiles them with Numba.\n"
            '"""\n\n'
            f"from heuristics.ops import {', '.join(sorted(helpers))}  # noqa: F401\n\n\n"
            + "\n\n".join(funcs)
            + "\n\n# Registry names, in the order of the rules table.\n"
            + f"BASELINES = {{\n{registry}\n}}\n")


def main(argv: list[str]) -> int:
    text = module_text()
    if "--write" in argv:
        atomic_write_text(PACKAGE_HEURISTICS / "baselines.py", text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
