"""`evolve export --format vllm-patch`: the diff against vLLM 0.33.0's rejection sampler.

Always: the diff applies with `patch -p1` to synthetic files (the excerpt at its
pinned line; the replaced lines elsewhere), the patched text parses, the lines it
puts in the kernel compute the exported torch rule when `tl` is played by torch,
and rules reading what the kernel lacks are refused in one line. Slow: the
release's sdist is downloaded (47 MB), its file checked and patched
(benchmarks/checks/vllm_patch_check.py); the patched kernel runs in Triton's interpreter
when EVOLVE_VLLM_TRITON names a directory holding triton (pip install --target).

Also guarantee 34 of docs/reliability.md, What an export decides is what was scored: see
tests/test_faithful.py.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import urllib.error
from pathlib import Path

import numpy as np
import pytest

from evolve.export import vllm_patch as V
from evolve.export.modules import ExportError, export_source
from evolve.lang import primitives as P
from evolve.lang import treeio
from tests.clikit import fake_trace_run, invoke, one_line_error

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
META = {"run": "r", "seed": 3, "metrics": {}}
TREES = (
    "pmin(1.0, pdiv(target_prob, draft_prob))",
    "pmin(1.0, pdiv(target_prob, mul(0.5, draft_prob)))",
    "pmax(1.0, 1.0)",
    "ite(lt(0.4, target_prob), 1.0, pmin(1.0, pdiv(target_prob, mul(add(1.0, "
    "block_position), draft_prob))))",
    # every primitive, with constants that float32 cannot hold
    "ite(or_(not_(lt(target_prob, draft_prob)), and_(lt(0.1, target_prob), "
    "lt(block_position, 2.0))), 0.7000000000000001, sub(psqrt(pexp(neg(square(absf("
    "plog(target_prob)))))), pmax(pmin(draft_prob, 0.2), neg(pdiv(0.1, sub(target_prob, "
    "target_prob))))))",
)
needs_patch = pytest.mark.skipif(shutil.which("patch") is None, reason="no patch program")


def synthetic(head: int, tail: int = 5) -> list[str]:
    """A Python file holding the excerpt inside a kernel-like function, from line
    ``head`` on."""
    lines = ["import triton.language as tl", "", "", "def kernel():"]
    lines += ["    x = 0"] * (head - 1 - len(lines) - 3)
    lines += ["    for pos in range(3):", "        if True:", "            if True:"]
    return lines + list(V.EXCERPT) + [" " * 16 + "pass"] + ["    y = 1"] * tail + [""]


def run_patch(tmp_path, text: str, patch: str):
    target = tmp_path / V.PATH
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    r = subprocess.run(["patch", "-p1", "--forward", "--batch"], input=patch, text=True,
                       cwd=tmp_path, capture_output=True)
    assert r.returncode == 0, r.stdout + r.stderr
    return target.read_text(), r.stdout


@needs_patch
def test_exported_patch_applies_at_the_pinned_line_without_offset_or_fuzz(tmp_path):
    nodes = treeio.parse(TREES[3])
    lines = synthetic(V.EXCERPT_LINE)
    assert lines[V.EXCERPT_LINE - 1] == V.EXCERPT[0]
    text = "\n".join(lines)
    patch = V.patch_source(nodes, META, "Acceptance rule exported from run r")
    patched, said = run_patch(tmp_path, text, patch)
    assert "offset" not in said and "fuzz" not in said, said
    assert patched == V.apply(text, nodes)
    ast.parse(patched)
    assert V.REPLACED[-1] not in patched and "accepted = uniform_prob < rule_" in patched
    # everything else is left as it was
    assert patched.replace("\n".join(V.replacement(nodes)), "\n".join(V.REPLACED)) == text
    header = [line for line in patch.splitlines() if not line.startswith(("-", "+", " ", "@"))]
    assert all(line.startswith("#") for line in header)
    assert f"vLLM {V.RELEASE}" in patch and V.FILE_SHA256 in patch and "run: r" in patch


@needs_patch
def test_diff_of_any_file_holding_the_accept_test(tmp_path):
    nodes = treeio.parse(TREES[1])
    lines = synthetic(40, tail=30)
    text = "\n".join(lines)
    diff = "\n".join(V.patch_lines(lines, nodes)) + "\n"
    hunk = next(line for line in diff.splitlines() if line.startswith("@@"))
    start = lines.index(V.EXCERPT[0]) + 1
    new_len = 2 * V.CONTEXT + len(V.replacement(nodes))
    assert hunk.startswith(f"@@ -{start},{len(V.EXCERPT)} +{start},{new_len} @@")
    patched, said = run_patch(tmp_path, text, diff)
    assert "offset" not in said and patched == V.apply(text, nodes)


def test_text_without_the_accept_test_once_is_refused():
    nodes = treeio.parse(TREES[0])
    lines = synthetic(20)
    with pytest.raises(ExportError, match="found 0 times"):
        V.patch_lines([x.replace(">= uniform_prob", "> uniform_prob") for x in lines], nodes)
    with pytest.raises(ExportError, match="found 2 times"):
        V.patch_lines(lines + lines, nodes)


def test_every_primitive_has_a_triton_template():
    assert set(V.TRITON.templates) == set(P.BY_NAME)


class _TorchTL:
    """Just enough of ``triton.language`` to run the replacement lines on torch tensors."""
    float64 = torch.float64
    where, abs, log, exp, sqrt = torch.where, torch.abs, torch.log, torch.exp, torch.sqrt

    @staticmethod
    def full(shape, value, dtype):
        return torch.full(shape, value, dtype=dtype)

    @staticmethod
    def zeros(shape, dtype):
        return torch.zeros(shape, dtype=dtype)


def _kernel_decisions(nodes, draft_prob, target_prob, pos, u):
    code = "\n".join(line.strip() for line in V.replacement(nodes))
    ns = {"tl": _TorchTL, "draft_prob": draft_prob, "target_prob": target_prob, "pos": pos,
          "uniform_prob": u}
    exec(code, ns)
    threshold = ns[code.splitlines()[-1].split("< ")[-1]]
    return ns["accepted"], threshold


class _Ptr:
    """A pointer into a flat tensor, as the kernel's pointer arithmetic makes them."""

    def __init__(self, flat, off=0):
        self.flat, self.off = flat, off

    def __add__(self, other):
        return _Ptr(self.flat, self.off + other)

    __radd__ = __add__


def _where(c, a, b):
    return torch.where(torch.as_tensor(c), torch.as_tensor(a), torch.as_tensor(b))


class _ScalarTL(_TorchTL):
    """``triton.language`` for one program's scalars, with loads through ``_Ptr``."""
    int64 = torch.int64
    where = staticmethod(_where)

    @staticmethod
    def arange(a, b):
        return torch.arange(a, b)

    @staticmethod
    def load(ptr, mask=None, other=0.0):
        idx = torch.as_tensor(ptr.off)
        vals = ptr.flat[idx.clamp(0, ptr.flat.numel() - 1)]
        return vals if mask is None else torch.where(mask, vals, torch.as_tensor(other,
                                                                                 dtype=vals.dtype))

    @staticmethod
    def sum(x, axis=None):
        return x.sum()


def kernel_scope_decisions(nodes, scope, q, p, tokens, pos, u, no_draft_probs=False):
    """The decisions of the lines the patch puts in vLLM's kernel, one drafted token
    (one row of q, p: [rows, vocab]) at a time, with torch playing triton.language and
    the kernel's own variables set as the kernel sets them before its accept test."""
    import textwrap
    code = textwrap.dedent("\n".join(V.replacement(nodes, scope)))
    out = np.empty(len(tokens), dtype=bool)
    for i, (x, b) in enumerate(zip(tokens, pos)):
        qrow, prow = torch.as_tensor(q[i]), torch.as_tensor(p[i])
        ns = {"tl": _ScalarTL, "draft_prob": 1 if no_draft_probs else qrow[int(x)],
              "target_prob": prow[int(x)], "pos": int(b), "uniform_prob": torch.tensor(u[i]),
              # the row of this draft is row start_idx + pos of draft_probs: here row 0
              "draft_probs_ptr": _Ptr(qrow), "start_idx": -int(b), "vocab_size": qrow.numel(),
              "draft_token_id": int(x), "NO_DRAFT_PROBS": no_draft_probs}
        exec(code, ns)
        out[i] = bool(ns["accepted"])
    return out


@pytest.mark.parametrize("tree", TREES)
def test_kernel_lines_compute_the_exported_torch_rule(tree):
    """The replacement, run with torch standing in for tl on float32 probability values
    (as vLLM's kernel loads them) and float64 uniforms: the same thresholds, to the
    bit, and decisions as the torch export in float64, q(x) given or absent (1)."""
    nodes = treeio.parse(tree)
    ns: dict = {}
    exec(export_source(nodes, "torch", META, "t"), ns)
    g = torch.Generator().manual_seed(7)
    n = 4000
    p = torch.rand(n, generator=g).float()
    p[:50] = 0.0                                    # edges: p = 0, p = q, tiny q
    q = torch.rand(n, generator=g).float()
    q[50:100] = p[50:100]
    q[100:150] = 1e-12
    pos = torch.randint(0, 8, (n,), generator=g)
    u = torch.rand(n, generator=g, dtype=torch.float64)
    # float32 values held in float64 tensors: torch would keep a float32 tensor plus a
    # 0-d float64 in float32, where Triton widens the kernel's float32 scalars (that
    # widening is checked in Triton's interpreter, below)
    for draft in (q.double(), 1):
        got, h = _kernel_decisions(nodes, draft, p.double(), pos, u)
        qx = torch.ones(n, dtype=torch.float64) if isinstance(draft, int) else q.double()
        f = {"draft_prob": qx, "target_prob": p.double(), "block_position": pos.double()}
        args = [f.get(k, torch.zeros(n, dtype=torch.float64)) for k in ns["INPUTS"]]
        if "top_token_match" in ns["INPUTS"]:
            args[ns["INPUTS"].index("top_token_match")] = torch.zeros(n, dtype=torch.bool)
        want = ns["threshold"](*args)
        assert h.dtype == torch.float64
        torch.testing.assert_close(torch.broadcast_to(h, (n,)), want, rtol=0, atol=0,
                                   equal_nan=True)
        assert torch.equal(torch.broadcast_to(got, (n,)), ns["accept"](u, *args))


@pytest.mark.parametrize("name", [n for n in P.TRACE_INPUT_NAMES if n not in V.KERNEL_INPUTS])
def test_inputs_the_kernel_lacks_are_refused(tmp_path, name):
    leaf = f"ite({name}, 1.0, 0.5)" if name == "top_token_match" else name
    tree = f"pmin(1.0, add(pdiv(target_prob, draft_prob), mul(0.0, {leaf})))"
    with pytest.raises(ExportError, match=repr(name)):
        V.patch_source(treeio.parse(tree), META, "t")
    runs = tmp_path / "runs"
    fake_trace_run(runs, "bad", tree)
    out = tmp_path / "rule.patch"
    r = invoke("export", "bad", "--format", "vllm-patch", "--out", out, "--runs-dir", runs)
    one_line_error(r, "--format vllm-patch", repr(name), "draft_prob, target_prob, "
                   "block_position")
    assert not out.exists()


def test_cli_prints_and_writes_the_patch(tmp_path):
    runs = tmp_path / "runs"
    fake_trace_run(runs, "ok", TREES[1])
    printed = invoke("export", "ok", "--format", "vllm-patch", "--runs-dir", runs)
    assert printed.exit_code == 0, printed.output
    out = tmp_path / "rule.patch"
    r = invoke("export", "ok", "--format", "vllm-patch", "--out", out, "--runs-dir", runs)
    assert r.exit_code == 0 and out.read_text() == printed.stdout
    assert f"--- a/{V.PATH}" in printed.stdout and "run: ok" in printed.stdout
    assert "vllm-patch" in invoke("export", "--help").stdout


# ------------------------------------------------------------------ the release

@pytest.fixture(scope="module")
def sdist(tmp_path_factory):
    given = os.environ.get("EVOLVE_VLLM_SDIST")
    if given:
        return Path(given)
    from benchmarks.checks import vllm_patch_check as check
    try:
        return check.obtain_sdist(None, tmp_path_factory.mktemp("vllm"))
    except (urllib.error.URLError, OSError) as e:
        pytest.skip(f"cannot download vLLM {V.RELEASE}'s sdist ({e}); set EVOLVE_VLLM_SDIST "
                    "to a copy of vllm-0.33.0.tar.gz")


def _check(sdist, *extra):
    r = subprocess.run([sys.executable, "-m", "benchmarks.checks.vllm_patch_check", "--sdist", str(sdist),
                        "--json", *extra],
                       capture_output=True, text=True, cwd=ROOT,
                       env={k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"})
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout)


@pytest.mark.slow
@needs_patch
def test_patch_applies_to_the_release_and_its_kernel_decides_as_the_rule(sdist):
    """The script's three steps: the sdist's and the file's sha256, the excerpt at its
    line, `patch -p1` of five rules and the patched files parse; then the patched
    kernel in Triton's interpreter decides as the exported rule. Triton is the one
    installed here (the gpu extra), or ``EVOLVE_VLLM_TRITON=DIR`` (a ``pip install
    --target DIR triton`` directory)."""
    triton = os.environ.get("EVOLVE_VLLM_TRITON")
    report = _check(sdist, *(("--triton", triton) if triton else ()), "--rows", "64")
    assert report["release"] == V.RELEASE and report["patched"]["rules"] == 5
    kernel = report["kernel"]
    if isinstance(kernel, str) and not triton:
        pytest.skip(f"{kernel}: pip install triton, or set EVOLVE_VLLM_TRITON")
    assert isinstance(kernel, dict), kernel
    assert kernel["release"]["rows"] == 64 and len(kernel) == 11      # 5 rules, bare and scoped
    assert all(len(cases) == 4 for tree, cases in kernel.items() if tree != "release")
