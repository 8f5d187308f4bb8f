"""Check `evolve export --format vllm-patch` against the vLLM release it names.

    python -m benchmarks.checks.vllm_patch_check [--sdist FILE] [--cache DIR]
                                          [--triton DIR] [--tree TREE ...] [--json]

1. Obtains vLLM's sdist (``evolve.export.vllm_patch.SDIST_URL``, 47 MB; or
   ``--sdist FILE``, or the copy in ``--cache``), checks its sha256, takes
   ``vllm/v1/sample/rejection_sampler.py`` out of it and checks that file's
   sha256 and the excerpt the exporter carries (lines and line number).
2. For every rule (``--tree``, default: the rules below), writes the exported
   patch, applies it with ``patch -p1`` to a copy of the file, and checks that
   the result is ``vllm_patch.apply`` of the file and parses as Python, and that
   the diff built from the whole file is the exported one.
3. With Triton importable (``--triton DIR``: a ``pip install --target DIR
   triton`` directory, put first on ``sys.path``), runs
   ``rejection_random_sample_kernel`` of the unpatched and of every patched file
   in Triton's interpreter (``TRITON_INTERPRET=1``, CPU tensors), the kernel's
   own function loaded on its own (nothing else of vLLM is imported):
   unpatched, each decision equals vLLM's test in float32, p/q >= u, which is
   the standard rule u < min(1, p/q) up to ties; patched, the decisions equal
   the exported torch rule's, u < threshold(q(x), p(x), block position) in
   float64, on requests of one draft (every decision seen) and of several (the
   accepted prefix, block positions 0..7), with and without draft probabilities;
   and each rule again with a scope (``SCOPE``: the rule decides drafts among the
   draft's top 3 at block positions 0..4, vLLM's own test the others), against the
   scoped torch export (``draft_rank``, ``acceptance``).

Prints what was checked; exit 1 when a check fails, 2 on bad input.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
from pathlib import Path


from evolve.export import vllm_patch as V  # noqa: E402
from evolve.export.modules import ExportError, export_source  # noqa: E402
from evolve.lang import treeio  # noqa: E402

TREES = (
    "pmin(1.0, pdiv(target_prob, draft_prob))",                        # the standard rule
    "pmin(1.0, pdiv(target_prob, mul(0.5, draft_prob)))",              # leniency 0.5
    "pmax(pmin(1.0, pdiv(target_prob, draft_prob)), 0.3)",             # ratio floor
    "ite(lt(0.4, target_prob), 1.0, pmin(1.0, pdiv(target_prob, mul(add(1.0, "
    "block_position), draft_prob))))",
    "ite(or_(not_(lt(target_prob, draft_prob)), and_(lt(0.1, target_prob), "
    "lt(block_position, 2.0))), 1.0, sub(psqrt(pexp(neg(square(absf(plog(target_prob)))))), "
    "pmin(draft_prob, 0.2)))",                                         # every primitive
)


class CheckFailed(Exception):
    pass


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def obtain_sdist(sdist: Path | None, cache: Path) -> Path:
    """The release's sdist with the pinned sha256: ``sdist``, the cached copy, or a
    download into ``cache``."""
    if sdist is None:
        sdist = cache / f"vllm-{V.RELEASE}.tar.gz"
        if not sdist.exists():
            cache.mkdir(parents=True, exist_ok=True)
            tmp = sdist.with_suffix(".part")
            with urllib.request.urlopen(V.SDIST_URL, timeout=120) as r, open(tmp, "wb") as fh:
                shutil.copyfileobj(r, fh)
            tmp.replace(sdist)
    digest = sha256(sdist.read_bytes())
    if digest != V.SDIST_SHA256:
        raise CheckFailed(f"{sdist}: sha256 {digest}, expected {V.SDIST_SHA256} "
                          f"(vllm-{V.RELEASE}.tar.gz)")
    return sdist


def release_file(sdist: Path) -> str:
    """The text of the release's vllm/v1/sample/rejection_sampler.py, its sha256 and
    excerpt checked."""
    with tarfile.open(sdist, "r:gz") as tar:
        data = tar.extractfile(V.SDIST_MEMBER).read()
    if sha256(data) != V.FILE_SHA256:
        raise CheckFailed(f"{V.SDIST_MEMBER}: sha256 {sha256(data)}, expected {V.FILE_SHA256}")
    text = data.decode("utf-8")
    lines = text.split("\n")
    first = V.EXCERPT_LINE - 1
    if tuple(lines[first:first + len(V.EXCERPT)]) != V.EXCERPT:
        raise CheckFailed(f"{V.PATH}: lines {V.EXCERPT_LINE}.. are not the exporter's excerpt")
    return text


def check_patch(text: str, tree: str, workdir: Path) -> str:
    """Apply the exported patch of ``tree`` with ``patch -p1``; the patched text."""
    nodes = treeio.parse(tree)
    patch = V.patch_source(nodes, {"run": "check", "metrics": {}}, "check")
    whole = V.patch_lines(text.split("\n"), nodes)
    if patch.splitlines()[-len(whole):] != whole:
        raise CheckFailed(f"{tree}: the diff from the excerpt differs from the whole file's")
    target = workdir / V.PATH
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    r = subprocess.run(["patch", "-p1", "--forward", "--batch"], input=patch, text=True,
                       cwd=workdir, capture_output=True)
    if r.returncode != 0:
        raise CheckFailed(f"{tree}: patch -p1 failed: {r.stdout.strip()} {r.stderr.strip()}")
    patched = target.read_text()
    if patched != V.apply(text, nodes):
        raise CheckFailed(f"{tree}: patch -p1 made another file than vllm_patch.apply")
    ast.parse(patched)
    return patched


# ------------------------------------------------------------ Triton interpreter

def load_kernel(text: str, tag: str, workdir: Path):
    """``rejection_random_sample_kernel`` of ``text`` on its own: its source (decorator
    included) in a module that imports only triton."""
    tree = ast.parse(text)
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == V.KERNEL)
    lines = text.split("\n")[fn.decorator_list[0].lineno - 1:fn.end_lineno]
    path = workdir / f"kernel_{tag}.py"
    path.write_text("import triton\nimport triton.language as tl\n\n\n" + "\n".join(lines)
                    + "\n")
    import importlib.util
    spec = importlib.util.spec_from_file_location(f"vllm_kernel_{tag}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return getattr(mod, V.KERNEL)


def run_kernel(kernel, ids, q, p, u, cu, no_draft_probs):
    """The kernel's output rows: per request, the accepted drafts, then the recovered
    token (-7) at the first rejection, or the bonus token (-9) after the last draft."""
    import torch
    batch = cu.shape[0]
    counts = torch.diff(cu, prepend=torch.zeros(1, dtype=cu.dtype))
    width = int(counts.max()) + 1
    out = torch.full((batch, width), -1, dtype=torch.int32)
    kernel[(batch,)](out, cu, ids, None if no_draft_probs else q, p,
                     torch.full((batch,), -9, dtype=torch.int64),
                     torch.full((ids.shape[0],), -7, dtype=torch.int32), u,
                     torch.zeros(batch, dtype=torch.bool), width - 1, p.shape[1], None,
                     NO_DRAFT_PROBS=no_draft_probs, SYNTHETIC_MODE=False)
    return out


def accepted_prefix(out, ids, cu):
    """Accepted drafts per request, read from the kernel's output."""
    import torch
    starts = torch.cat([torch.zeros(1, dtype=cu.dtype), cu[:-1]])
    n = []
    for b in range(cu.shape[0]):
        k = 0
        while k < int(cu[b] - starts[b]) and int(out[b, k]) == int(ids[starts[b] + k]):
            k += 1
        n.append(k)
    return torch.tensor(n)


def inputs(seed: int, n: int, vocab: int, cu):
    import torch
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(n, vocab, generator=g) * 2.5, -1).float().contiguous()
    q = torch.softmax(torch.randn(n, vocab, generator=g) * 2.5, -1).float().contiguous()
    ids = torch.randint(0, vocab, (n,), generator=g, dtype=torch.int32)
    u = torch.rand(n, generator=g, dtype=torch.float64)
    idx = torch.arange(n)
    starts = torch.cat([torch.zeros(1, dtype=cu.dtype), cu[:-1]])
    req = torch.searchsorted(cu, idx, right=True)
    block = (idx - starts[req]).double()
    return p, q, ids, u, block


# The scope a champion scored on traces carries (evolve.data.traces.scope_of): the rule
# decides drafts among the draft's top 3 of the 6 test tokens at block positions 0..4,
# vLLM's own test the others (positions 5..7 of the eight-draft requests).
SCOPE = {"top_k": 3, "vocab_size": 6, "block_size": 5, "temperature": 1.0,
         "truncation": None, "backend": "hf"}


def scoped_expected(ns, u, args, q, ids, ratio32, block, no_q):
    """The scoped export's decisions: the rule inside the scope (rank of the draft under
    q, float32 as the kernel loads it; ties: lower id first), vLLM's float32 test
    p/q >= u outside it."""
    import torch
    if no_q:
        rank = torch.zeros(len(ids), dtype=torch.long)
    else:
        rank = ns["draft_rank"](q, ids.long())
    inside = (rank < SCOPE["top_k"]) & (block < SCOPE["block_size"])
    rule = u < ns["acceptance"](torch.zeros_like(rank), *args)
    return torch.where(inside, rule, ratio32 >= u)


def check_kernels(text: str, trees, workdir: Path, rows: int) -> dict:
    import torch
    results = {}
    single = torch.arange(1, rows + 1, dtype=torch.int32)        # one draft per request
    blocks = torch.arange(8, rows + 1, 8, dtype=torch.int32)     # eight per request
    plain = load_kernel(text, "release", workdir)
    p, q, ids, u, _ = inputs(0, rows, 6, single)
    r = torch.arange(rows)
    got = run_kernel(plain, ids, q, p, u, single, False)[:, 0] == ids
    ratio = (p[r, ids.long()] / q[r, ids.long()]).double()      # float32, as the kernel
    standard = u < torch.clamp(ratio, max=1.0)
    if not torch.equal(got, standard):
        raise CheckFailed(f"unpatched kernel: {int((got != standard).sum())} of {rows} "
                          "decisions differ from u < min(1, p/q)")
    results["release"] = {"rows": rows, "accepted": int(got.sum())}
    for i, tree in enumerate(trees):
        for scope in (None, SCOPE):
            key = tree if scope is None else f"{tree} [scope]"
            results[key] = _check_rule(text, tree, scope, workdir, f"rule{i}{scope is None}",
                                       single, blocks)
    return results


def _check_rule(text, tree, scope, workdir, tag, single, blocks) -> dict:
    import torch
    nodes = treeio.parse(tree)
    kernel = load_kernel(V.apply(text, nodes, scope), tag, workdir)
    ns: dict = {}
    exec(compile(export_source(nodes, "torch", {"metrics": {}, "scope": scope}, "check"),
                 "<torch>", "exec"), ns)
    out = {}
    for no_q in (False, True):
        for name, cu in (("single", single), ("blocks", blocks)):
            n = int(cu[-1])
            p, q, ids, u, block = inputs(1 + no_q, n, 6, cu)
            idx = torch.arange(n)
            qx = torch.ones(n, dtype=torch.float64) if no_q else q[idx, ids.long()].double()
            f = {"draft_prob": qx, "target_prob": p[idx, ids.long()].double(),
                 "block_position": block}
            args = [f.get(k, torch.zeros(n, dtype=torch.float64)) for k in ns["INPUTS"]]
            if "top_token_match" in ns["INPUTS"]:
                args[ns["INPUTS"].index("top_token_match")] = torch.zeros(n, dtype=torch.bool)
            if scope is None:
                want = ns["accept"](u, *args)
            else:
                ratio32 = (p[idx, ids.long()] / (1.0 if no_q else q[idx, ids.long()])
                           ).double()
                want = scoped_expected(ns, u, args, q, ids, ratio32, block, no_q)
            res = run_kernel(kernel, ids, q, p, u, cu, no_q)
            if name == "single":
                got = res[:, 0] == ids
                bad = int((got != want).sum())
                kept = int(got.sum())
            else:
                prefix = accepted_prefix(res, ids, cu)
                expect = torch.stack([(~w).int().cumsum(0).eq(0).sum()
                                      for w in want.view(-1, 8)])
                bad = int((prefix != expect).sum())
                kept = int(prefix.sum())
            if bad:
                raise CheckFailed(f"{tree}: {name}, draft probabilities "
                                  f"{'absent' if no_q else 'given'}: {bad} decisions "
                                  "differ from the exported torch rule")
            out[f"{name}{'_no_q' if no_q else ''}"] = {"rows": n, "accepted": kept}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sdist", type=Path, default=None, help="vllm-0.33.0.tar.gz already here")
    ap.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "vllm-sdist",
                    help="where the downloaded sdist is kept")
    ap.add_argument("--triton", type=Path, default=None,
                    help="a directory holding the triton package (pip install --target)")
    ap.add_argument("--tree", action="append", default=None, help="a rule (repeatable)")
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.sdist is not None and not args.sdist.is_file():
        print(f"--sdist: {args.sdist} is not a file", file=sys.stderr)
        return 2
    if args.rows < 8 or args.rows % 8:
        print(f"--rows: {args.rows} must be a positive multiple of 8", file=sys.stderr)
        return 2
    trees = tuple(args.tree or TREES)
    report = {"release": V.RELEASE, "file": V.PATH, "file_sha256": V.FILE_SHA256}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            text = release_file(obtain_sdist(args.sdist, args.cache))
            for i, tree in enumerate(trees):
                check_patch(text, tree, Path(tmp) / f"apply{i}")
            report["patched"] = {"rules": len(trees), "patch -p1": "ok", "parses": True}
            if args.triton is not None:
                sys.path.insert(0, str(args.triton))
            os.environ["TRITON_INTERPRET"] = "1"
            try:
                import triton  # noqa: F401   # lazy: only with a Triton at hand
            except ImportError:
                report["kernel"] = "not run: triton is not importable (give --triton DIR)"
            else:
                report["kernel"] = check_kernels(text, trees, Path(tmp), args.rows)
    except CheckFailed as e:
        print(f"FAILED: {e}", file=sys.stderr)
        return 1
    except (treeio.TreeError, ExportError) as e:
        print(f"--tree: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print(f"vLLM {V.RELEASE} {V.PATH} (sha256 {V.FILE_SHA256[:16]}...): patch applies "
              f"and parses for {len(trees)} rules")
        k = report["kernel"]
        print(k if isinstance(k, str) else
              "kernel in Triton's interpreter: unpatched = u < min(1, p/q); patched = the "
              f"exported torch rule, {len(trees)} rules x 4 cases, without and with a "
              "scope (top 3 of 6 tokens, block positions 0..4), every decision equal")
    return 0


if __name__ == "__main__":
    sys.exit(main())
