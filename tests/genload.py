"""Import a generated module from a file (tests only: the harness never imports files
it did not ship)."""

import importlib.util
import sys


def load_module_from(path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.modules.pop(name, None)
    return mod
