"""The trace kernel on a device: ``evolve.kernels.speculative.population_sums``, bit for
bit, by the fused Triton kernels (``evolve.kernels.gpu.fused``) or, as a fallback, in
torch (``choice.kernel_for`` chooses; what follows is the torch one's way, and where a
split's columns live for both).

A split's candidate inputs and per-candidate and per-row constants (the kernel's own
``Prepared`` constants, back in block order) are put on the device once
(``device_split``, cached on the ``TraceArrays``); a minibatch (``blocks``) is a
gather on the device. Columns larger than ``stream.RESIDENT_SHARE`` of the memory
budget stay on the host instead, blocks first, and each chunk of blocks is copied to
the device once per population (a minibatch's blocks gathered on the host first;
``evolve.kernels.gpu.stream``). A population is scored in batches of programs over chunks of
whole blocks that fit the memory budget (``evolve.kernels.gpu.memory_budget``;
``chunk_blocks`` and ``batch_programs`` force sizes): plog, pexp and psqrt of the
chunk's inputs once (``interp.derived``), the thresholds of a batch, then
the per-block terms of ``kernels.speculative._tile_sums``, one operation per step in
the kernel's order, with the blocks (and programs) as the vector.

Each block's values are rounded to the 128-bit fixed point of ``kernels.fixed``
exactly as ``fixed.add_to`` does, but held as four integer limbs (2^87, 2^64, 2^32,
1; each below 2^33) that add on the device without overflow; the limb sums are
finished into the (hi, lo) words modulo 2^128 on the host. Integer sums are
order-free, so any chunking gives the integers of the Numba kernel.
"""

from __future__ import annotations

import numpy as np
import torch

from evolve.kernels import gpu, layout
from evolve.kernels.fixed import HI_SHIFT, LIMIT
from evolve.kernels.gpu import choice, interp, stream
from evolve.kernels.layout import (M_TAIL, P_TMINUS, P_TPLUS, Q_STD, Q_SUM, Q_TAIL, Q_TPLUS,
                                   R_TMINUS, R_TPLUS, TAIL_OFF, Z_RES)
from evolve.kernels.speculative import _check_inputs, lane_major, prepared


_WORD = (1 << 64) - 1


class Shape:
    """``g``, ``k``, ``n`` (rows) and ``n_blocks`` of a split scored on a device, and
    ``missing`` (why it has no slot features, "" when it has them: ``TraceArrays.missing``)."""

    def __init__(self, g: int, k: int, n_blocks: int, missing: str):
        self.g, self.k, self.n_blocks, self.n = g, k, n_blocks, n_blocks * g
        self.missing = missing


def _block_order(lane: np.ndarray, n: int, per: int, g: int, tb: int) -> np.ndarray:
    """The inverse of ``speculative.lane_major``: lane-major values back in row order."""
    where = lane_major(np.arange(n * per).reshape(n, per), g, tb)
    out = np.empty(n * per, dtype=lane.dtype)
    out[where] = lane
    return out


FIELDS = ("X", "lq", "lp", "lr", "lrow", "ldc", "lsx")     # a DeviceTrace's per-block tensors
BLOCK_AXIS = {"X": 1, "lrow": 1}                           # the others have the blocks first


class DeviceTrace:
    """A trace split's inputs and constants for one torch device, in block order:
    X (inputs, blocks, g * k); lq, lp, lr (blocks, g, k); lrow (constants, blocks, g);
    ldc, lsx (blocks, g). Resident: these tensors on the device. ``streaming``: they
    stay on the host, blocks first (``host``; pinned on CUDA), and ``select`` copies a
    chunk's blocks to the device (counted in ``copies[0]``); a minibatch (``blocks``)
    keeps its block numbers (``idx``) and gathers each chunk on the host."""

    streaming = False
    host = None          # streaming: field -> host tensor, blocks first
    idx = None           # streaming minibatch: the whole split's block numbers (numpy)
    copies = None        # streaming: [chunks copied to the device], shared with minibatches

    @classmethod
    def of(cls, sa, dev, streaming: bool | None = None) -> "DeviceTrace":
        """The columns of ``sa`` for ``dev``: streaming when ``streaming`` says so, or
        (None) when they do not fit ``stream.RESIDENT_SHARE`` of the memory budget."""
        pr = prepared(sa)
        n, k, g, tb = sa.n, sa.k, sa.g, pr.tile_blocks
        nb = n // g
        cols = {"X": np.asarray(sa.X).reshape(sa.X.shape[0], nb, g * k)}
        cols.update(zip(("lq", "lp", "lr"), (_block_order(a, n, k, g, tb).reshape(nb, g, k)
                                             for a in (pr.lq, pr.lp, pr.lr))))
        cols["lrow"] = np.stack([_block_order(r, n, 1, g, tb) for r in pr.lrow]).reshape(
            pr.lrow.shape[0], nb, g)
        cols["ldc"] = _block_order(pr.ldc, n, 1, g, tb).reshape(nb, g)
        cols["lsx"] = _block_order(pr.lsx, n, 1, g, tb).reshape(nb, g)
        nbytes = column_bytes(sa)
        self = cls()
        self.shape = Shape(g, k, nb, sa.missing)
        self.device = dev
        self.bytes_per_block = -(-nbytes // max(1, nb))
        self.streaming = not stream.fits(nbytes, dev) if streaming is None else bool(streaming)
        if self.streaming:
            self.host, self.copies = {}, [0]
        for f in FIELDS:
            a = cols.pop(f)            # one field's copy at a time
            if self.streaming:
                self.host[f] = stream.host(np.moveaxis(a, BLOCK_AXIS.get(f, 0), 0), dev)
            else:
                setattr(self, f, torch.as_tensor(np.ascontiguousarray(a), device=dev))
        return self

    @property
    def n_inputs(self) -> int:
        return int(self.host["X"].shape[1] if self.streaming else self.X.shape[0])

    def _like(self, n_blocks: int) -> "DeviceTrace":
        out = DeviceTrace()
        out.shape = Shape(self.shape.g, self.shape.k, n_blocks, self.shape.missing)
        out.device, out.bytes_per_block = self.device, self.bytes_per_block
        return out

    def _resident(self, pick) -> "DeviceTrace":
        """A resident DeviceTrace of ``pick(tensor, block axis)`` of every field."""
        parts = {f: pick(f, BLOCK_AXIS.get(f, 0)) for f in FIELDS}
        out = self._like(parts["lq"].shape[0])
        for f, t in parts.items():
            setattr(out, f, t)
        return out

    def select(self, b0: int, b1: int) -> "DeviceTrace":
        """Blocks b0..b1 on the device: a view when resident; streaming, copied from
        the host now (one copy per field; a minibatch's blocks gathered on the host)."""
        if not self.streaming:
            return self._resident(lambda f, d: getattr(self, f).narrow(d, b0, b1 - b0))
        self.copies[0] += 1
        if self.idx is None:
            take = lambda t: t.narrow(0, b0, b1 - b0)     # noqa: E731 (contiguous, pinned)
        else:
            rows = torch.from_numpy(self.idx[b0:b1])
            take = lambda t: t.index_select(0, rows)     # noqa: E731
        return self._resident(lambda f, d: stream.to_device(take(self.host[f]),
                                                            self.device).movedim(0, d))

    def blocks(self, idx) -> "DeviceTrace":
        """The blocks ``idx`` (sorted block numbers): gathered on the device when
        resident; streaming, kept as numbers and gathered chunk by chunk."""
        idx = np.asarray(idx, dtype=np.int64)
        if not self.streaming:
            rows = torch.as_tensor(idx, device=self.device)
            return self._resident(lambda f, d: getattr(self, f).index_select(d, rows))
        out = self._like(len(idx))
        out.streaming, out.host, out.copies = True, self.host, self.copies
        out.idx = idx if self.idx is None else self.idx[idx]
        return out


def column_bytes(sa) -> int:
    """Bytes of the device columns of ``sa`` (``DeviceTrace.FIELDS``), without making them."""
    return int(np.asarray(sa.X).nbytes) + 8 * sa.n * (3 * sa.k + layout.N_ROW_CONSTANTS + 2)


def device_split(sa, dev, streaming: bool | None = None) -> DeviceTrace:
    """The device columns of ``sa`` (a ``spec.TraceArrays``) for ``dev``, made once
    (resident or streaming, decided then: ``DeviceTrace.of``)."""
    cache = getattr(sa, "_torch", None)
    if cache is None:
        cache = {}
        object.__setattr__(sa, "_torch", cache)
    key = str(dev)
    if key not in cache:
        cache[key] = DeviceTrace.of(sa, dev, streaming)
    return cache[key]


def _limbs(v: torch.Tensor) -> torch.Tensor:
    """Block values (..., nb) as fixed point (``fixed.add_to``: NaN is 0, saturating at
    +-LIMIT), in four signed int64 limbs (4, ..., nb): weights 2^87, 2^64, 2^32, 1."""
    v = torch.where(v != v, 0.0, v)
    v = torch.where(v > LIMIT, LIMIT, torch.where(v < -LIMIT, -LIMIT, v))
    neg = v < 0.0
    t = torch.where(neg, -v, v) * 2.0 ** HI_SHIFT
    hf = torch.floor(t)
    lf = torch.floor((t - hf) * 2.0 ** 64 + 0.5)       # in [0, 2^64], as the kernel
    a = torch.floor(lf * 2.0 ** -32)                    # exact: powers of two
    b = lf - a * 2.0 ** 32
    hh = torch.floor(hf * 2.0 ** -23)
    hl = hf - hh * 2.0 ** 23
    sign = 1 - 2 * neg.to(torch.int64)
    return torch.stack([hh, hl, a, b]).to(torch.int64) * sign


def finish(limbs: np.ndarray) -> np.ndarray:
    """Limb sums (4, ...) to fixed-point (..., 2) (hi, lo) int64, modulo 2^128 as the
    kernel's wrapping words."""
    limbs = np.asarray(limbs, dtype=np.int64)
    words = []
    for a, b, c, d in zip(*limbs.reshape(4, -1).tolist()):
        t = ((a << 87) + (b << 64) + (c << 32) + d) % (1 << 128)
        hi, lo = t >> 64, t & _WORD
        words.append((hi - (1 << 64) if hi >> 63 else hi, lo - (1 << 64) if lo >> 63 else lo))
    return np.array(words, dtype=np.int64).reshape(*limbs.shape[1:], 2)


def _kl_term(o: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """``speculative._kl_term``: o log(o / p) with ``log_poly``, 0 where o <= 0."""
    return torch.where(o > 0.0, o * interp.log_poly(o / p), 0.0)


def block_values(H: torch.Tensor, d: DeviceTrace, cap: float,
                 with_kl: bool = False) -> torch.Tensor:
    """The layout's values of every block, (programs, width(g), blocks) float64, from
    clipped thresholds H (programs, blocks, g, k): ``_tile_sums`` step by step (the KL
    terms too with ``with_kl``; else the kl sum is 0)."""
    g, k = d.shape.g, d.shape.k
    L = layout.sums_layout(g)
    P_, nb = H.shape[0], H.shape[1]
    vals = torch.zeros((P_, L.width, nb), dtype=torch.float64, device=H.device)
    w = torch.ones((P_, nb), dtype=torch.float64, device=H.device)
    tok = torch.ones_like(w)
    tvb, exb, tail = torch.zeros_like(w), torch.zeros_like(w), torch.zeros_like(w)
    klb = torch.zeros_like(w)
    for s in range(g):
        row = d.lrow[:, :, s]
        qa = torch.zeros_like(w)
        for c in range(k):
            qa = qa + d.lq[:, s, c] * H[:, :, s, c]
        scale = ((row[Q_SUM] - qa) + (row[Q_TAIL] - row[M_TAIL])) / row[Z_RES]
        tv = torch.zeros_like(w)
        kl = torch.zeros_like(w) if with_kl else None
        for c in range(k):      # each candidate's output once, for its TV and KL terms
            o = d.lq[:, s, c] * H[:, :, s, c] + scale * d.lr[:, s, c]
            tv = tv + torch.abs(o - d.lp[:, s, c])
            if with_kl:
                kl = kl + _kl_term(o, d.lp[:, s, c])
        alpha = qa + row[M_TAIL]
        o_tp = row[Q_TPLUS] + scale * row[R_TPLUS]
        o_tm = row[P_TMINUS] + scale * row[R_TMINUS]
        tv = (tv + (torch.abs(o_tp - row[P_TPLUS]) + torch.abs(o_tm - row[P_TMINUS]))) * 0.5
        if with_kl:
            kl = kl + (_kl_term(o_tp, row[P_TPLUS]) + _kl_term(o_tm, row[P_TMINUS]))
            klb = klb + w * torch.where(kl > 0.0, kl, 0.0)
        vals[:, L.acc_num.start + s] = w * alpha
        vals[:, L.reach.start + s] = w
        vals[:, L.tv_pos.start + s] = w * tv
        tok = tok + w * alpha
        tvb = tvb + w * tv
        exb = exb + w * (qa - row[Q_STD])
        tail = tail + torch.where(tv > cap, w, 0.0)
        dc = d.ldc[:, s]
        drafted = H[:, :, s, :].gather(2, dc.clamp(min=0).expand(P_, nb).unsqueeze(2))[:, :, 0]
        w = w * torch.where(dc >= 0, drafted, d.lsx[:, s])
    vals[:, L.tokens] = tok
    vals[:, L.tv] = tvb
    vals[:, L.kl] = klb
    vals[:, L.extra] = exb
    vals[:, L.tokens_sq] = tok * tok
    vals[:, L.tail] = tail
    return vals


def sizes(programs, d: DeviceTrace, dev, chunk_blocks, batch_programs) -> tuple:
    """(blocks per chunk, programs per batch): forced, or what the memory budget holds
    (a program's stack and temporaries, and plog, pexp and psqrt of the inputs, over
    a chunk's candidates; a batch's
    thresholds, values and limbs per block); streaming, also a chunk's columns copied
    to the device (``DeviceTrace.bytes_per_block``)."""
    g, k = d.shape.g, d.shape.k
    budget = gpu.memory_budget(dev)
    per_block_eval = 8 * g * k * (int(programs.max_stack) + 32 + 4 * d.n_inputs) \
        + (d.bytes_per_block if d.streaming else 0)
    per_block_prog = 8 * (3 * g * k + 20 * layout.width(g) + 64)   # values, limbs, copies
    nb = int(chunk_blocks) if chunk_blocks else max(1, budget // 2 // per_block_eval)
    nb = max(1, min(nb, max(1, d.shape.n_blocks)))
    pb = int(batch_programs) if batch_programs else max(1, budget // 2 // (per_block_prog * nb))
    return nb, max(1, min(pb, len(programs)))


def population_sums(programs, sa, with_kl: bool = True, tail_cap: float = TAIL_OFF,
                    blocks=None, *, chunk_blocks: int | None = None,
                    batch_programs: int | None = None, kernel: str | None = None,
                    device) -> np.ndarray:
    """``kernels.speculative.population_sums`` on torch device ``device`` (resolved by
    ``evolve.objectives.placement``), the same arguments and the same integers: exact sums
    for every program, int64 (P, layout.width(g), 2), over every block of ``sa`` or over
    ``blocks`` (with ``with_kl=False`` the kl sum is 0 and its logarithms are skipped);
    by the fused kernels or the torch ones (``choice.kernel_for``; ``kernel`` forces
    one). ``chunk_blocks`` and ``batch_programs`` force sizes (else the memory budget's)."""
    dev = device
    _check_inputs(programs, sa)
    d = device_split(sa, dev)
    if blocks is not None:
        d = d.blocks(blocks)
    g, k, P_ = d.shape.g, d.shape.k, len(programs)
    out = np.zeros((P_, layout.width(g), 2), dtype=np.int64)
    if not P_ or not d.shape.n_blocks:
        return out
    nb, pb = sizes(programs, d, dev, chunk_blocks, batch_programs)
    fused = choice.fused_for(dev, kernel)
    progs = interp.program_lists(programs) if fused is None else fused.Programs(programs, dev)
    acc = torch.zeros((4, P_, layout.width(g)), dtype=torch.int64, device=dev)
    zero = torch.zeros((), dtype=torch.float64, device=dev)
    for b0 in range(0, d.shape.n_blocks, nb):
        part = d.select(b0, min(d.shape.n_blocks, b0 + nb))    # streaming: copied here, once
        if fused is not None:
            cols = fused.candidate_major(part)
            for p0 in range(0, P_, pb):
                fused.trace_sums(progs, cols, g, k, acc, p0, min(P_, p0 + pb), float(tail_cap),
                                 bool(with_kl))
            continue
        m = part.shape.n_blocks
        X = part.X.reshape(part.X.shape[0], m * g * k)
        U = interp.derived(X)           # plog, pexp, psqrt of the chunk's inputs, once
        for p0 in range(0, P_, pb):
            batch = progs[p0:p0 + pb]
            H = torch.empty((len(batch), m * g * k), dtype=torch.float64, device=dev)
            for i, (ops, consts) in enumerate(batch):
                H[i] = interp.run(ops, consts, X, U)
            H = torch.fmin(torch.fmax(H, zero), zero + 1.0) + 0.0
            vals = block_values(H.view(len(batch), m, g, k), part, float(tail_cap),
                                bool(with_kl))
            acc[:, p0:p0 + len(batch)] += _limbs(vals).sum(dim=-1)
    return finish(acc.cpu().numpy())
