"""Resident or streamed: where a split's device columns live (``evolve.kernels.gpu``).

A split whose device columns take at most ``RESIDENT_SHARE`` of the memory budget
(``gpu.memory_budget``) is put on the device once and kept there (resident). A larger
one stays on the host, in pinned memory when the device is CUDA (plain memory on
torch's CPU device), rows or blocks first so that a chunk is one contiguous piece,
and each chunk is copied to the device when a population is scored: one copy per
column per chunk per population, never per program. The results are the same
integers either way (``evolve.kernels.gpu.tokens``, ``evolve.kernels.gpu.traces``).
"""

from __future__ import annotations

import numpy as np
import torch

from evolve.kernels import gpu

RESIDENT_SHARE = 0.5     # columns up to half the budget stay on the device


def fits(nbytes: int, dev) -> bool:
    """Whether columns of ``nbytes`` bytes stay on ``dev`` (resident) rather than stream."""
    return nbytes <= RESIDENT_SHARE * gpu.memory_budget(dev)


def host(a: np.ndarray, dev) -> torch.Tensor:
    """``a`` as a contiguous host tensor from which chunks are copied to ``dev``: pinned
    when ``dev`` is a CUDA device (plain memory where pinning is refused)."""
    if dev.type == "cuda":
        src = torch.as_tensor(a)           # a view of ``a`` where its strides allow
        try:                               # one copy, straight into pinned memory
            return torch.empty(src.shape, dtype=src.dtype, pin_memory=True).copy_(src)
        except RuntimeError:               # pinning refused: pageable, copied synchronously
            return src.contiguous()
    return torch.from_numpy(np.ascontiguousarray(a))


def to_device(t: torch.Tensor, dev) -> torch.Tensor:
    """A host chunk on ``dev``: asynchronous from pinned memory (ordered on the device's
    stream before the operations that read it)."""
    return t.to(dev, non_blocking=t.is_pinned())
