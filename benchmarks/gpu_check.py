"""``python benchmarks/gpu_check.py [...]``: every GPU figure in one command, the same as
``python -m benchmarks.speed.gpu_check [...]`` (run from anywhere; see that module)."""

import runpy
import sys
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    runpy.run_module("benchmarks.speed.gpu_check", run_name="__main__", alter_sys=True)
