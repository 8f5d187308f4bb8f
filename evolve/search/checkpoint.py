"""Checkpoint validation: every field of a checkpoint is type- and range-checked
and every tree parsed against the primitive table (never evaluated) before
anything is restored."""

from __future__ import annotations

import math
import random

from evolve.lang import treeio
from evolve.search.config import Config, shorten


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def check_state(state, config: Config):
    """Validate a checkpoint's structure; returns (random state tuple, generation)."""
    if not isinstance(state, dict):
        raise ValueError(f"checkpoint must be an object, got {type(state).__name__}")
    generation = state.get("generation")
    if not _is_int(generation) or generation < 0:
        raise ValueError(f"field 'generation' must be a whole number >= 0, "
                         f"got {shorten(repr(generation))}")
    rs = state.get("random_state")
    if not (isinstance(rs, list) and len(rs) == 3 and _is_int(rs[0])
            and isinstance(rs[1], list) and all(_is_int(x) and 0 <= x < 2 ** 32 for x in rs[1])
            and (rs[2] is None or _is_number(rs[2]))):
        raise ValueError("field 'random_state' is not a random-module state "
                         "[version, [ints], gauss]")
    rng_state = (rs[0], tuple(rs[1]), None if rs[2] is None else float(rs[2]))
    try:
        random.Random().setstate(rng_state)
    except (TypeError, ValueError, OverflowError) as e:
        raise ValueError(f"field 'random_state' is not a valid state ({e})") from None
    pop = state.get("population")
    if not isinstance(pop, list) or len(pop) != config.population:
        got = f"{len(pop)} individuals" if isinstance(pop, list) else type(pop).__name__
        raise ValueError(f"field 'population' must hold {config.population} individuals "
                         f"(the config's population), got {got}")
    hof = state.get("hall_of_fame")
    if not isinstance(hof, list) or not 1 <= len(hof) <= config.hof_size:
        got = f"{len(hof)} entries" if isinstance(hof, list) else type(hof).__name__
        raise ValueError(f"field 'hall_of_fame' must hold 1..{config.hof_size} entries, "
                         f"got {got}")
    check_entries("population", pop, generation, config=config)
    check_entries("hall_of_fame", hof, generation, config=config)
    return rng_state, generation


def check_entries(field: str, items, generation: int, limit: int | None = None,
                  config: Config | None = None) -> None:
    """Population items (tree, fitness, born) or hall-of-fame entries (also size);
    with ``config``, every tree must also be within its size and height limits
    (the limits every tree of a run keeps: a larger one was not made by the run)."""
    if limit is not None and (not isinstance(items, list) or len(items) > limit):
        raise ValueError(f"field '{field}' must be a list of at most {limit} entries")
    hof_like = field != "population"
    for i, item in enumerate(items):
        keys = ("tree", "fitness", "born") + (("size",) if hof_like else ())
        if not isinstance(item, dict) or any(k not in item for k in keys):
            raise ValueError(f"field '{field}' item {i}: expected an object with "
                             f"{', '.join(keys)}")
        if not isinstance(item["tree"], str):
            raise ValueError(f"field '{field}' item {i}: 'tree' must be a string")
        fit = item["fitness"]
        multi = field == "population" and isinstance(fit, list)
        if not (_is_number(fit) or (multi and len(fit) == 2 and all(map(_is_number, fit)))):
            raise ValueError(f"field '{field}' item {i}: 'fitness' must be a finite "
                             f"number, got {shorten(repr(item['fitness']))}")
        cd = item.get("crowding")
        if cd is not None and not _is_number(cd):
            raise ValueError(f"field '{field}' item {i}: 'crowding' must be a finite number "
                             f"or null, got {shorten(repr(cd))}")
        if not _is_int(item["born"]) or not 0 <= item["born"] <= generation:
            raise ValueError(f"field '{field}' item {i}: 'born' must be a generation "
                             f"0..{generation}, got {shorten(repr(item['born']))}")
        nodes = treeio.parse(item["tree"]) if (hof_like or config is not None) else None
        if hof_like and (not _is_int(item["size"]) or item["size"] != len(nodes)):
            raise ValueError(f"field '{field}' item {i}: 'size' is not the tree's node count")
        if config is not None:
            check_tree_limits(field, i, nodes, config)


def check_tree_limits(field: str, i: int, nodes, config: Config) -> None:
    if len(nodes) > config.max_size:
        raise ValueError(f"field '{field}' item {i}: the tree has {len(nodes)} nodes, more "
                         f"than the run's max_size {config.max_size}")
    height = treeio.depth(nodes)
    if height > config.max_height:
        raise ValueError(f"field '{field}' item {i}: the tree has height {height}, more "
                         f"than the run's max_height {config.max_height}")
