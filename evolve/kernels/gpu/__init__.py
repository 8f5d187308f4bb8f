"""Population evaluation on a CUDA device: the same results, bit for bit, as the Numba
kernels (``evolve.kernels.tokens``, ``evolve.kernels.speculative``).

``device="cpu"`` (the default everywhere) never imports torch or Triton;
``device="cuda"`` evaluates every population with one of two kernels
(``evolve.kernels.gpu.choice.kernel_for``):

- ``fused``: the fused interpreter in Triton (``evolve.kernels.gpu.fused``), one
  launch per population and chunk of rows, each thread interpreting the programs on
  its rows with the stack in registers; chosen on a CUDA device when Triton imports
  and its compiled kernels pass ``fused.probe`` (the Numba interpreter's bits on every
  primitive at the edges), once per process;
- ``torch``: the fallback, the torch code of ``evolve.kernels.gpu.interp`` (the
  interpreter and the primitive set, one torch operation per arithmetic step).

``evolve.kernels.gpu.tokens`` (the token counts) and ``evolve.kernels.gpu.traces``
(the trace kernel's exact sums) run either. ``evolve.kernels.gpu.stream`` decides where a
split's columns live: on the device once (resident), or on the host (pinned on CUDA),
copied chunk by chunk when they take more than half the memory budget. The code is
device-agnostic: the tests run it on torch's CPU device and compare it with the Numba
kernels bit for bit.

The environment variable ``EVOLVE_TORCH_DEVICE`` (tests only) makes ``cuda`` mean
another torch device (``EVOLVE_TORCH_DEVICE=cpu``: the same torch code on the CPU),
so that the whole ``--device cuda`` path runs on a machine without a GPU; it takes
``cpu``, ``cuda`` and ``cuda:N`` only, and ``cuda`` ones need that CUDA device.
``EVOLVE_TORCH_MEMORY`` sets the memory budget in bytes (see ``memory_budget``). Both
are checked by ``torch_device``, so a bad value is one line before any work.
``EVOLVE_GPU_KERNEL`` (``fused`` or ``torch``) forces a kernel; ``fused`` on torch's CPU
device runs it in Triton's interpreter (``TRITON_INTERPRET=1``, set here before the
kernels are first imported), which is how the tests check it without a GPU.

This module is the device itself (its name checked, the torch device it stands for, the
memory budget, out-of-memory errors); which kernels score on it is
``evolve.kernels.gpu.choice``, which imports the fused kernels, which import this
module. It imports nothing heavy. Only ``evolve.objectives.placement`` resolves a run's
``device`` with it (``torch_device``); the kernels take the torch device it gives.
"""

from __future__ import annotations

import importlib.util
import os
import re
from dataclasses import dataclass

from evolve.errors import EvolveError, show

DEVICES = ("cpu", "cuda")
KERNELS = ("fused", "torch")
KERNEL = "EVOLVE_GPU_KERNEL"          # forces one of KERNELS (default: fused when it can run)
OVERRIDE = "EVOLVE_TORCH_DEVICE"      # tests: the torch device "cuda" stands for
MEMORY = "EVOLVE_TORCH_MEMORY"        # the memory budget in bytes
CPU_BUDGET = 256 * 2 ** 20            # torch on the CPU (tests): 256 MiB of scratch
OVERRIDE_NAME = re.compile(r"cpu|cuda(:[0-9]{1,3})?", re.ASCII)


class DeviceError(EvolveError):
    """A device that cannot be used (no torch, no CUDA device, out of its memory, the
    fused kernels forced without Triton); one line naming the parameter ``device``."""


def check_name(device) -> None:
    """``device`` is one of DEVICES (no torch import)."""
    if device not in DEVICES:
        raise DeviceError.of("device", f"{device!r} is invalid; expected one of "
                             f"{', '.join(DEVICES)}")


def torch_device(device: str):
    """The torch device that evaluates for ``device`` ("cuda"): checked once here,
    with a one-line DeviceError when torch or a CUDA device is missing, or
    ``EVOLVE_GPU_KERNEL`` is not a kernel (or forces "fused" without Triton)."""
    check_name(device)
    if device == "cpu":
        raise DeviceError.of("device", "'cpu' is evaluated by the Numba kernels, not torch")
    try:
        import torch  # lazy: torch is an optional dependency (the gpu extra)
    except ImportError:
        raise DeviceError.of("device", "'cuda' needs torch (pip install '.[gpu]')") from None
    forced_kernel()
    override = os.environ.get(OVERRIDE)
    dev = _override(torch, override) if override else None
    if dev is None or dev.type == "cuda":
        _check_cuda(torch, dev)
    memory_setting()                  # a bad budget is refused here, before any work
    return dev or torch.device("cuda")


def _override(torch, text: str):
    """The torch device EVOLVE_TORCH_DEVICE names: ``cpu``, ``cuda`` or ``cuda:N``;
    anything else (another device type, a name torch does not know) is a DeviceError."""
    bad = DeviceError(f"{OVERRIDE}: {show(text)} is invalid; expected cpu, cuda or cuda:N")
    if not OVERRIDE_NAME.fullmatch(text):
        raise bad
    try:
        return torch.device(text)
    except (RuntimeError, ValueError):
        raise bad from None


def _check_cuda(torch, dev) -> None:
    """A DeviceError unless torch has a CUDA device (and, for ``cuda:N``, device N)."""
    if not torch.cuda.is_available():
        where = f"{OVERRIDE}={dev}: " if dev is not None else ""
        raise DeviceError.of("device", f"'cuda': {where}torch finds no CUDA device "
                             f"(torch {torch.__version__}, built for CUDA "
                             f"{torch.version.cuda or 'none'})")
    count = torch.cuda.device_count()
    if dev is not None and dev.index is not None and dev.index >= count:
        raise DeviceError(f"{OVERRIDE}: {str(dev)!r} is invalid; this machine has "
                          f"{count} CUDA device{'s' if count != 1 else ''} "
                          f"(cuda:0..cuda:{count - 1})")


def memory_setting() -> int | None:
    """EVOLVE_TORCH_MEMORY in bytes (None when unset): a whole number >= 1, else a
    one-line DeviceError (``torch_device`` checks it, so before any work)."""
    given = os.environ.get(MEMORY)
    if not given:
        return None
    text = given.strip()
    value = int(text) if text.isascii() and text.isdigit() and len(text) <= 20 else 0
    if value < 1:
        raise DeviceError(f"{MEMORY}: {show(given)} is invalid; expected a whole number of "
                          "bytes >= 1 (such as 2000000000)")
    return value


def forced_kernel() -> str:
    """EVOLVE_GPU_KERNEL ("" when unset), checked: one of KERNELS, and Triton installed
    when it forces "fused" (without importing it)."""
    forced = os.environ.get(KERNEL, "")
    if forced and forced not in KERNELS:
        raise DeviceError(f"{KERNEL}: {forced!r} is invalid; expected one of "
                          f"{', '.join(KERNELS)}")
    if forced == "fused" and importlib.util.find_spec("triton") is None:
        raise DeviceError.of("device", f"'cuda' with {KERNEL}=fused needs triton "
                             f"(pip install triton), or set {KERNEL}=torch")
    return forced


def memory_budget(dev) -> int:
    """Bytes of device memory one evaluation may use for its scratch: EVOLVE_TORCH_MEMORY
    if set, else a third of the CUDA device's free memory (256 MiB on the CPU). A split's
    columns stay on the device when they take at most half of it (``stream.fits``)."""
    given = memory_setting()
    if given is not None:
        return given
    if dev.type == "cuda":
        import torch  # lazy: only on the device path
        free, _ = torch.cuda.mem_get_info(dev)
        return max(free // 3, 2 ** 20)
    return CPU_BUDGET


def out_of_memory_types() -> tuple:
    """The exceptions torch raises when a device runs out of memory."""
    import torch  # lazy: only on the device path
    types = [getattr(torch, "OutOfMemoryError", None),
             getattr(getattr(torch, "cuda", None), "OutOfMemoryError", None)]
    return tuple({t for t in types if isinstance(t, type)})


@dataclass(frozen=True)
class Device:
    """A run's device resolved (``resolve``): ``name`` as the run names it ("cuda", in
    its errors) and ``torch``, the torch device the kernels take (``device=``)."""
    name: str
    torch: object

    def guarded(self, fn):
        """``fn`` with torch's out-of-memory errors as one-line DeviceErrors."""
        return guarded(fn, self.name)


def resolve(device: str) -> Device:
    """The ``Device`` that evaluates for ``device`` ("cuda"): ``torch_device``'s checks,
    once (``evolve.objectives.placement.resolve`` is where a run's device is resolved)."""
    return Device(device, torch_device(device))


def guarded(fn, device: str):
    """``fn`` with torch's out-of-memory errors turned into one-line DeviceErrors."""
    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except out_of_memory_types() as e:
            line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise DeviceError.of("device", f"{device!r} ran out of memory ({line[:160]}); "
                                 f"set {MEMORY} lower, or resume on 'cpu'") from None
    return call
