"""The named layout of the trace kernel's sums and per-row constants
(``evolve.kernels.layout``): it tiles the row exactly, the kernel writes every
named sum where the layout says, every reader finds it there (also when the
layout moves), and the decoder's ``RESIDUAL_EPS`` has one definition."""

import ast
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from evolve.data import decode
from evolve.kernels import layout
from evolve.kernels import speculative as K
from evolve.kernels import tokens as token_kernels
from evolve.lang import treeio
from evolve.objectives import spec
from evolve.objectives.trace_objectives import SPEED
from tests import tracekit

ROOT = Path(__file__).resolve().parents[1]
NAMES = layout.SCALARS + layout.SERIES + layout.TRAILING
TREES = ["pmin(1.0, pdiv(target_prob, draft_prob))", "pmin(1.0, add(target_prob, 0.3))",
         "sub(1.0, mul(draft_entropy, 0.2))", "p_max", "pmin(q_max, target_prob)"]


@pytest.fixture(scope="module")
def sa():
    return spec.TraceArrays.from_split(tracekit.split("valid"))


def _indices(field) -> list:
    return list(range(field.start, field.stop)) if isinstance(field, slice) else [field]


@pytest.mark.parametrize("g", [1, 2, 3, 4, 7, 16])
def test_layout_fields_tile_the_sums_exactly(g):
    """Every index 0..width-1 belongs to exactly one named field, in the declared
    order: no gap, no overlap; the series are g long and the width is what the
    kernel allocates."""
    L = layout.sums_layout(g)
    fields = L.fields()
    assert tuple(fields) == NAMES
    covered = [i for f in fields.values() for i in _indices(f)]
    assert covered == list(range(L.width))
    assert L.width == layout.width(g) == K.new_sums((), g).shape[0]
    for n in layout.SERIES:
        assert len(_indices(fields[n])) == g
    for n in layout.SCALARS + layout.TRAILING:
        assert isinstance(fields[n], int)
    # the kernel's compile-time indices are the same positions
    assert L.tokens == layout.TOKENS and L.tv == layout.TV and L.kl == layout.KL
    assert L.extra == layout.EXTRA and L.tokens_sq == layout.TOKENS_SQ
    assert L.acc_num.start == layout.series_start(layout.ACC_NUM, g)
    assert L.reach.start == layout.series_start(layout.REACH, g)
    assert L.tv_pos.start == layout.series_start(layout.TV_POS, g)
    assert L.tail == layout.trailing_index(layout.TAIL, g)


def test_row_constants_have_distinct_indices_in_order():
    idx = [getattr(layout, n.upper()) for n in layout.ROW_CONSTANTS]
    assert idx == list(range(layout.N_ROW_CONSTANTS))


def test_compiled_kernel_agrees_with_the_layout(monkeypatch):
    """The indices compiled into the kernel are the layout's; a kernel compiled (and
    cached) for another layout is refused instead of writing at old offsets."""
    K._LAYOUT_CHECKED.clear()
    K.check_compiled_layout()
    monkeypatch.setattr(layout, "sums_layout", _moved_layout)
    K._LAYOUT_CHECKED.clear()
    with pytest.raises(RuntimeError, match="another sums layout"):
        K.check_compiled_layout()
    monkeypatch.undo()
    K._LAYOUT_CHECKED.clear()
    K.check_compiled_layout()


def _reference_sums(sa, h, cap: float) -> dict:
    """Every named sum of thresholds h, from the numpy reference."""
    terms = spec.position_terms(sa, h)
    b = spec.block_sums(sa, terms)
    tv = terms.tv.reshape(sa.n_blocks, sa.g)
    return {"tokens": b["tokens"].sum(), "tv": b["tv"].sum(), "kl": b["kl"].sum(),
            "extra": b["extra"].sum(), "tokens_sq": (b["tokens"] ** 2).sum(),
            "acc_num": (b["W"] * b["alpha"]).sum(axis=0), "reach": b["W"].sum(axis=0),
            "tv_pos": (b["W"] * tv).sum(axis=0), "tail": b["W"][tv > cap].sum()}


def test_kernel_writes_every_named_sum_where_the_layout_says(sa):
    """Each named field of the kernel's row is that sum of the reference (a write at
    a shifted offset puts a different sum there)."""
    cap = 0.05
    progs = treeio.linearise([treeio.parse(t) for t in TREES])
    rows = K.population_objectives(progs, sa, with_kl=True, tail_cap=cap)
    assert rows.shape == (len(TREES), layout.width(sa.g))
    h_all = token_kernels.matrix_thresholds(progs, sa.X)
    L = layout.sums_layout(sa.g)
    nonzero = []
    for i, t in enumerate(TREES):
        ref = _reference_sums(sa, h_all[i], cap)
        nonzero.append(all(np.all(np.asarray(v) > 0) for v in ref.values()))
        for name, field in L.fields().items():
            assert rows[i, field] == pytest.approx(ref[name], rel=1e-9, abs=1e-12), (t, name)
    assert any(nonzero)            # some tree has every sum non-zero


def test_prepared_row_constants_are_named_right(sa):
    """Each row of ``Prepared.lrow`` is the constant its name says (lane-major)."""
    pr = K.prepared(sa)
    cq, cp = sa.cq.reshape(sa.n, sa.k), sa.cp.reshape(sa.n, sa.k)
    rplus = np.maximum(cp - cq, 0.0)
    z = rplus.sum(axis=1) + (sa.ep - sa.eq)
    fb = z < decode.RESIDUAL_EPS
    want = {"q_sum": cq.sum(axis=1), "q_std": (cq * np.minimum(1.0, cp / cq)).sum(axis=1),
            "m_tail": sa.eq + (sa.tp - sa.ep), "q_tail": sa.tq, "q_tplus": sa.eq,
            "p_tplus": sa.ep, "p_tminus": sa.tp - sa.ep,
            "z_res": np.where(fb, cp.sum(axis=1) + sa.tp, z),
            "r_tplus": np.where(fb, sa.ep, sa.ep - sa.eq),
            "r_tminus": np.where(fb, sa.tp - sa.ep, 0.0)}
    assert pr.lrow.shape[0] == layout.N_ROW_CONSTANTS
    for name in layout.ROW_CONSTANTS:
        j = getattr(layout, name.upper())
        lm = K.lane_major(want[name], sa.g, pr.tile_blocks)
        assert np.array_equal(pr.lrow[j], lm), name


# ------------------------------------------------- readers follow the layout

def _moved_layout(g: int) -> layout.SumsLayout:
    """A layout where every field moved: one spare sum first, the fields in reverse."""
    pos, f = 1, {}
    for name in reversed(NAMES):
        n = g if name in layout.SERIES else 1
        f[name] = slice(pos, pos + n) if name in layout.SERIES else pos
        pos += n
    return layout.SumsLayout(g=g, width=pos, **f)


def _row(L: layout.SumsLayout, values: dict) -> np.ndarray:
    row = np.full(L.width, np.nan)
    for name, field in L.fields().items():
        row[field] = values[name]
    return row


def _values(g: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    v = {n: rng.uniform(1.0, 2.0, g) if n in layout.SERIES else float(rng.uniform(1.0, 2.0))
         for n in NAMES}
    v["tokens"] = float(rng.uniform(50.0, 60.0))
    v["tokens_sq"] = v["tokens"] ** 2 / 40 + 5.0
    return v


def test_moved_layout_is_a_different_tiling():
    for g in (1, 3):
        std, moved = layout.sums_layout(g), _moved_layout(g)
        assert moved.width == std.width + 1
        for name in NAMES:                     # every offset differs
            assert _indices(moved.fields()[name]) != _indices(std.fields()[name]), name


@pytest.mark.parametrize("g", [1, 3, 4])
def test_readers_find_every_sum_through_the_layout(g, monkeypatch):
    """With the layout moved (a spare sum first, every field elsewhere), the readers
    give the same results from a row written by name: a reader that indexes the sums
    by a bare number reads the wrong sum (or the spare NaN) and fails here."""
    nb = 40
    vals = _values(g, g)
    std_rows = np.stack([_row(layout.sums_layout(g), vals)] * 2)
    moved_rows = np.stack([_row(_moved_layout(g), vals)] * 2)

    def read(rows):
        ev = SimpleNamespace(rows=lambda trees, deap_trees=None: rows,
                             arrays=SimpleNamespace(g=g, n_blocks=nb))
        o = spec.objectives_from_sums(rows[0], nb, g).to_dict()
        return o, SPEED.measures(ev, ["a", "b"]), SPEED.tokens_tv(ev, ["a", "b"])

    want = read(std_rows)
    assert all(np.isfinite(v).all() for v in want[1].values())
    monkeypatch.setattr(layout, "sums_layout", _moved_layout)
    got = read(moved_rows)
    assert got[0] == want[0]
    assert got[1].keys() == want[1].keys()
    for k in want[1]:
        assert np.array_equal(got[1][k], want[1][k]), k
    for a, b in zip(got[2], want[2]):
        assert np.array_equal(a, b)


READERS = ["evolve/objectives/spec.py", "evolve/objectives/trace_objectives.py",
           "evolve/objectives/trajectory.py", *sorted(
               str(p.relative_to(ROOT)) for p in (ROOT / "evolve/cluster").glob("*.py"))]


@pytest.mark.parametrize("path", READERS)
def test_no_reader_indexes_kernel_sums_by_number(path):
    """Kernel rows (``sums``, ``s`` in the readers) are indexed by layout names only,
    never by a number or arithmetic on one (``sums[:, 5 + g]``)."""
    tree = ast.parse((ROOT / path).read_text())
    bad = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name)
                and node.value.id in ("sums", "s")):
            nums = [c for c in ast.walk(node.slice)
                    if isinstance(c, ast.Constant) and isinstance(c.value, (int, float))]
            if nums:
                bad.append(f"{path}:{node.lineno}: {ast.unparse(node)}")
    assert not bad, bad


# ------------------------------------------------------------ RESIDUAL_EPS

def test_residual_eps_has_one_definition():
    """Assigned once (evolve.data.decode); the objectives, the kernel and the hf
    export take that value, the export as a literal in its generated code."""
    from evolve.export import engines
    where = []
    for p in sorted((ROOT / "evolve").rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(t, ast.Name) and t.id == "RESIDUAL_EPS" for t in targets):
                    where.append(str(p.relative_to(ROOT)))
    assert where == ["evolve/data/decode.py"]
    assert spec.RESIDUAL_EPS is K.RESIDUAL_EPS is engines.RESIDUAL_EPS is decode.RESIDUAL_EPS
    hf = engines.HF.format(residual_eps=engines.RESIDUAL_EPS, entropy="", features="",
                           needs_classes=False, vocab_source="")
    assert f"\nRESIDUAL_EPS = {decode.RESIDUAL_EPS!r}\n" in hf
