"""Prepare the wheels ``benchmarks/speed/gpu_check.py`` installs on a GPU machine without a
package index: run this where an index is reachable, then take ``benchmarks/wheels/``
(git-ignored) along with the checkout::

    python -m benchmarks.speed.gpu_wheels [--dest DIR] [--python 3.10,3.11,3.12,3.13]
                                    [PACKAGE ...]

A GPU image with CUDA torch has torch, Triton (torch's own), numpy and usually numba
and transformers; what ``gpu_check.py`` needs beyond those is ``PACKAGES``: deap (pure
Python) and what it imports, moocore (compiled, one abi3 wheel) with cffi (compiled),
pycparser and platformdirs; a CUDA torch image of 2026-11 had none of them. Wheels are fetched with ``pip
download --no-deps --only-binary=:all:`` for each ``--python`` version on manylinux
x86_64, so a package with compiled code named on the command line gets one wheel per
version.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from benchmarks.common import ROOT
WHEELS = ROOT / "benchmarks" / "wheels"
# the releases the tests run with: deap, and what deap 1.4 imports that the image lacks
# (moocore, with cffi, pycparser and platformdirs)
PACKAGES = ("deap==1.4.4", "moocore==0.3.2", "cffi==2.1.1", "pycparser==3.12",
            "platformdirs==4.14.8")
PLATFORMS = ("manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_28_x86_64")


def download(packages, dest: Path, pythons) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for version in pythons:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--dest", str(dest), "--python-version", version]
        for platform in PLATFORMS:
            cmd += ["--platform", platform]
        subprocess.run(cmd + list(packages), check=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("packages", nargs="*", default=list(PACKAGES))
    ap.add_argument("--dest", type=Path, default=WHEELS)
    ap.add_argument("--python", default="3.10,3.11,3.12,3.13",
                    help="Python versions of the GPU machine, comma-separated")
    args = ap.parse_args(argv)
    try:
        download(args.packages, args.dest, args.python.split(","))
    except subprocess.CalledProcessError as e:
        print(f"gpu_wheels: pip download failed (exit code {e.returncode})", file=sys.stderr)
        return 2
    print(f"wheels in {args.dest}: " + ", ".join(sorted(p.name for p in args.dest.glob("*.whl"))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
