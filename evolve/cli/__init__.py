"""The `evolve` command: one function per command, no numerics here.

Commands, one module each:

- ``data``: ``evolve data`` on token splits (generate, import, export, describe);
- ``trace_data``: ``evolve data trace``, recording speculative-decoding traces;
- ``shards``: ``evolve data shard``, trace splits as memory-mapped shards;
- ``tasks``: ``evolve data task`` (task traces with critical-token labels) and
  ``evolve simulate-task``;
- ``runs``: ``evolve run``, ``inspect``, ``runs`` and ``benchmark``;
- ``traces``: ``evolve simulate`` and ``evolve tradeoff``;
- ``export``: ``evolve export``.

What they share is in ``common`` (one-line errors, the terminal, common options);
what they print in ``views`` (runs, benchmark, inspect) and ``trace_views``
(simulate, tradeoff); ``render`` is the one module that owns rich. Heavy modules
(numba, deap) are imported inside commands so that ``evolve --help`` starts fast.
"""

from __future__ import annotations

import click

from evolve.cli import data, export, pairs, runs, shards, tasks, trace_data, traces
from evolve.cli.common import OneLineGroup


@click.group(cls=OneLineGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="specevolve")
def main():
    """Discover acceptance rules for speculative decoding by genetic programming."""


main.add_command(data.data_group)
data.data_group.add_command(trace_data.data_trace)
data.data_group.add_command(shards.data_shard)
data.data_group.add_command(tasks.data_task)
data.data_group.add_command(pairs.data_pair)
for command in (runs.run_cmd, runs.benchmark_cmd, runs.inspect_cmd, runs.runs_cmd,
                traces.simulate_cmd, tasks.compare_task_cmd, traces.tradeoff_cmd,
                export.export_cmd):
    main.add_command(command)

if __name__ == "__main__":
    main()
