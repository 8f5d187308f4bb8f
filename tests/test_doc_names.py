"""Every module, attribute and file that the prose names exists.

Docstrings and comments of evolve/, heuristics/, benchmarks/ and tests/, the
pages of docs/ and the READMEs are read for three kinds of names:

- dotted names from the top of the tree (``evolve.kernels.layout.sums_layout``,
  ``heuristics.ops``, ``tests.tracekit.TINY``): the module must exist and every
  further part must be an attribute of it (a dataclass field counts);
- quoted dotted names that start with the short name of a module
  (``spec.objectives_from_sums``): an attribute of one of the modules of that name;
- dotted names relative to a subpackage of ``evolve`` (``kernels.fixed.total``),
  when their second part is a module of that subpackage or they follow "see":
  the same check under ``evolve.``;
- paths (``evolve/kernels/tokens.py``, ``docs/results.md``, ``tests/tracekit``)
  and bare file names (``numpy_eval.py``): the file or folder must exist, apart
  from the few files that commands write at run time, listed below.

A module renamed or moved without its mentions fails here, with the file and
line of each stale name.
"""

from __future__ import annotations

import ast
import importlib
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOPS = ("evolve", "heuristics", "benchmarks", "tests")
SUBPACKAGES = tuple(sorted(p.name for p in (ROOT / "evolve").iterdir()
                           if (p / "__init__.py").is_file()))

DOTTED = re.compile(r"(?<![\w./-])((?:%s)(?:\.[A-Za-z_]\w*)+)" % "|".join(TOPS))
RELATIVE = re.compile(r"(?<![\w./-])((?:%s)(?:\.[A-Za-z_]\w*)+)" % "|".join(SUBPACKAGES))
PATH = re.compile(r"(?<![\w./-])((?:%s|docs|datasets)/[\w./-]*)" % "|".join(TOPS))
EXTENSIONS = {"py", "md", "json", "npz", "txt", "toml", "yml", "lock", "png", "sha256"}
SEE = re.compile(r"\bsee\s*`*$", re.IGNORECASE)
QUOTED = re.compile(r"`([a-z_]\w*(?:\.[A-Za-z_]\w*)+)")
BARE = re.compile(r"(?<![\w./-])([\w-]+\.py)\b")

# Files and folders that commands write at run time, or that a page uses as an
# example of the user's own: named in the prose, absent from a fresh clone.
WRITTEN_AT_RUN_TIME = {
    "heuristics/evolved_trace.py",      # write-back of a trace run
    "heuristics/history",               # write-back keeps replaced champions here
    "heuristics/.evolved.lock",         # write-back's lock
    "datasets/traces",                  # evolve data trace (default output)
    "datasets/neural-traces",           # make neural-pair
    "datasets/neural-pair",             # the trained neural pair
    "datasets/traces-full",             # make results-engines (top-k 256)
    "datasets/neural-traces-full",      # make results-engines-neural (top-k 256)
    "datasets/my-traces",               # an example of the user's own output
    "datasets/my-task",                 # an example of the user's own task traces
    "evolve/objectives/toy.py",         # the scratch objective of docs/internals.md
    "datasets/task",                    # evolve data task (default output)
    "datasets/task-results",            # make results-task
    "datasets/pairs",                   # evolve data pair NAME (default folders)
    "benchmarks/speed/results.json",    # python -m benchmarks.speed.harness
    "benchmarks/speed/results-smoke.json", # python -m benchmarks.speed.harness --smoke
    "benchmarks/speed/startup-results.json", # python -m benchmarks.speed.startup
    "benchmarks/wheels",                # python -m benchmarks.speed.gpu_wheels
    "benchmarks/.gpu-site",             # python -m benchmarks.speed.gpu_check installs there
}
BARE_ALLOWED = {
    "champion.py",       # written into every run directory
    "evolved_trace.py",  # write-back of a trace run
    "rule_hf.py",        # an example export output
    # files a test plants in a run directory to show that nothing there is imported
    "numba.py", "numpy.py", "heuristics.py", "sitecustomize.py",
}


def _module_file(parts):
    base = ROOT.joinpath(*parts)
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    if base.is_dir() and parts[0] in TOPS:
        return base                     # a namespace package (benchmarks)
    return None


def _static_names(body) -> set[str]:
    """Names a module or class body binds, without running it."""
    names = set()
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name):
                        names.add(n.id)
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for a in node.names:
                names.add((a.asname or a.name).split(".")[0])
        elif isinstance(node, (ast.If, ast.Try, ast.With, ast.For)):
            for field in ("body", "orelse", "finalbody"):
                names |= _static_names(getattr(node, field, []) or [])
            for h in getattr(node, "handlers", []) or []:
                names |= _static_names(h.body)
    return names


def _static_lookup(path: Path, rest: list[str]) -> bool:
    tree = ast.parse(path.read_text())
    body = tree.body
    for i, name in enumerate(rest):
        if name not in _static_names(body):
            return False
        cls = [n for n in body if isinstance(n, ast.ClassDef) and n.name == name]
        if i + 1 < len(rest):
            if not cls:
                return False            # an attribute of a value: left to the import
            body = cls[-1].body
    return True


def _imported_lookup(module: str, rest: list[str]) -> bool:
    try:
        obj = importlib.import_module(module)
    except Exception:                   # an optional dependency missing: cannot confirm
        return False
    for name in rest:
        if hasattr(obj, name):
            obj = getattr(obj, name)
            continue
        fields = dict(getattr(obj, "__dataclass_fields__", {}) or {})
        for c in getattr(obj, "__mro__", ()):
            fields.update(getattr(c, "__annotations__", {}) or {})
        return name in fields
    return True


def resolves(dotted: str) -> bool:
    """Whether a dotted name is a module of the tree or an attribute of one."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        f = _module_file(parts[:i])
        if f is not None:
            break
    else:
        return False
    rest = parts[i:]
    if not rest:
        return True
    if f.is_dir():
        return False
    return _static_lookup(f, rest) or _imported_lookup(".".join(parts[:i]), rest)


def _path_exists(path: str) -> bool:
    path = path.rstrip(".")
    if not path or any(path == w or path.startswith(w + "/") for w in WRITTEN_AT_RUN_TIME):
        return True
    if (ROOT / path).exists() or (ROOT / (path.rstrip("/") + ".py")).is_file():
        return True
    # tests/tracekit.TINY: a module file and a name in it
    head, _, tail = path.rpartition("/")
    if "." in tail and not tail.endswith((".py", ".md", ".json")):
        return resolves(".".join(head.split("/") + tail.split(".")))
    return False


def _all_files():
    """The names of the tree's own modules (never of run directories or .venv)."""
    return {p.name for top in TOPS for p in (ROOT / top).rglob("*.py")}


def _modules_by_name() -> dict[str, list[str]]:
    """``spec`` -> [``evolve.objectives.spec``]: the modules a short name may mean."""
    mods: dict[str, list[str]] = {}
    for top in ("evolve", "heuristics"):
        for p in sorted((ROOT / top).rglob("*.py")):
            if p.name != "__init__.py" and "__pycache__" not in p.parts:
                dotted = ".".join(p.relative_to(ROOT).with_suffix("").parts)
                mods.setdefault(p.stem, []).append(dotted)
    return mods


MODULES = _modules_by_name()


def stale_names(text: str, all_py: set[str]) -> list[str]:
    """The names in one piece of prose that do not exist in the tree."""
    bad = []
    for m in DOTTED.finditer(text):
        if m.group(1).rsplit(".", 1)[1] in EXTENSIONS:
            continue                    # a file name (heuristics.py), checked below
        if not resolves(m.group(1)):
            bad.append(m.group(1))
    for m in RELATIVE.finditer(text):
        name = m.group(1)
        if name.rsplit(".", 1)[1] in EXTENSIONS:
            continue
        pkg, second = name.split(".")[:2]
        module = _module_file(["evolve", pkg, second]) is not None
        see = SEE.search(text[max(0, m.start() - 8):m.start()]) is not None
        if (module or see) and not resolves("evolve." + name):
            bad.append(name)
    for m in QUOTED.finditer(text):
        name = m.group(1)
        head, rest = name.split(".", 1)
        if head in TOPS or head in SUBPACKAGES or head not in MODULES:
            continue
        if rest.rsplit(".", 1)[-1] in EXTENSIONS:
            continue
        if not any(resolves(f"{full}.{rest}") for full in MODULES[head]):
            bad.append(name)
    for m in PATH.finditer(text):
        if not _path_exists(m.group(1)):
            bad.append(m.group(1))
    for m in BARE.finditer(text):
        name = m.group(1)
        if name not in all_py and name not in BARE_ALLOWED:
            bad.append(name)
    return bad


def _prose(path: Path):
    """(line, text) of every docstring and comment of a module, or of a whole page."""
    src = path.read_text()
    if path.suffix == ".md":
        yield from enumerate(src.splitlines(), 1)
        return
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc is not None:
                for k, line in enumerate(doc.splitlines()):
                    yield node.body[0].lineno + k, line


def _sources():
    files = []
    for top in TOPS:
        files += sorted(p for p in (ROOT / top).rglob("*.py") if "__pycache__" not in p.parts)
    files += sorted((ROOT / "docs").rglob("*.md"))
    files += [ROOT / "README.md"] + sorted(p for top in (*TOPS, "datasets")
                                           for p in (ROOT / top).glob("README.md"))
    return files


def test_every_name_in_docstrings_comments_and_docs_exists():
    all_py = _all_files()
    stale = []
    for path in _sources():
        for line, text in _prose(path):
            for name in stale_names(text, all_py):
                stale.append(f"{path.relative_to(ROOT)}:{line}: {name}")
    assert not stale, "names that do not exist:\n" + "\n".join(stale)


def test_the_check_finds_stale_names():
    """The check is a real one: names of modules, attributes and files that were
    renamed away are reported, and the ones that exist are not."""
    all_py = _all_files()
    gone = ("as in ``evolve.fitness``; see ``evolve/kernels.py``, evolve.traces, "
            "evolve.spec.TraceArrays, evolve.data.load_npz, (see kernels.population_counts), "
            "``kernels.fixed.nothing``, tests/nokit.TINY, docs/nowhere.md, fitnesses.py, "
            "``runner.no_such_function``")
    assert stale_names(gone, all_py) == [
        "evolve.fitness", "evolve.traces", "evolve.spec.TraceArrays", "evolve.data.load_npz",
        "kernels.population_counts", "kernels.fixed.nothing", "runner.no_such_function",
        "evolve/kernels.py", "tests/nokit.TINY", "docs/nowhere.md", "fitnesses.py"]
    here = ("``evolve.kernels.layout.sums_layout``, evolve.data.tokens.load_npz, "
            "evolve.api.RunResult, (see kernels.fixed.total), evolve/kernels/tokens.py, "
            "tests/tracekit.TINY, docs/results.md., heuristics/history/, numpy_eval.py, "
            "a variable's data.shape, ``python -m evolve.rules.source --write``, "
            "a planted heuristics.py, ``spec.objectives_from_sums``, ``layout.sums_layout(g)``")
    assert stale_names(here, all_py) == []
