"""Every GPU figure in one command, in one table with the device named.

A script of the source checkout, not part of the ``evolve`` package::

    python -m benchmarks.speed.gpu_check [--smoke] [--json FILE] [--wheels DIR] [--budget S]

On a machine with one GPU and no package index, in this order:

1. Installs what the machine lacks (``REQUIRED``; on a CUDA torch image that is deap
   and what it imports: moocore, cffi, pycparser, platformdirs)
   from the wheels ``benchmarks/speed/gpu_wheels.py`` prepared beforehand (``--wheels``,
   default ``benchmarks/wheels``), into ``benchmarks/.gpu-site`` (nothing of the
   machine's own environment is changed).
2. Checks the fused kernels on the device (``evolve.kernels.gpu.fused.probe``), then,
   before any timing, that every device kernel gives the Numba kernels' counts and
   128-bit trace sums on the populations it times (``benchmarks/speed/gpu_eval.py``).
3. Token kernel: 1,000 random trees over 4M rows, node evaluations per second of the
   fused kernel, the torch kernel and the Numba kernel on all CPU cores of the machine.
4. One trace generation: 1,000 trees over n-gram traces of 1M drafted tokens, the same
   three.
5. The Hugging Face decoder (``benchmarks/speed/hf_speed.py``) on random-init models of
   TinyLlama-1.1B and Llama-68M shapes (bf16, batch 32, 16 blocks of 4) at 64- and
   1,024-token prompts: the trace recorder and free-running decoding against the
   minimal KV-cached loop.
6. The exported transformers drop-in (``evolve export --format hf`` of the standard
   rule) inside ``generate`` on that pair (batch 1, as transformers' assisted
   generation), against transformers' own acceptance.
7. Label mining (``benchmarks/speed/mining.py``, ``device_section``): the miner's
   KV-cached continuations of a batch sized by the memory bound (half the free device
   memory, at most 2,048 / 1,024 rows), rows ending at different steps, against a
   minimal KV-cached greedy loop over the same batch, at the built-in task's size (a
   byte-level GPT-2 of 6 x 256, 128-token prompts, 64 steps) and at a 7B shape with
   random weights (Qwen2.5-7B-like, bf16, 256-token prompts, 64 steps): rows per
   second, and the peak memory mining took beyond the model against the estimate
   (``hf_pair.row_bytes``).

It prints one table (the device, torch, Triton and CUDA versions and the CPU count in
its title; each figure with what it is compared with, the ratio and the target) and
writes every figure to ``--json``, after every section. A kernel that fails its probe,
does not run or gives other results than the Numba kernel is left out of the timing and
named; so is a section that fails, and the others still run (exit code 1). Sections
that would start after ``--budget`` seconds (default 420) are reported as not run. On
one H100 the kernel sections took 3.0 minutes (torch kernel alone) and the Hugging Face
ones 2.3 minutes; figures and files in ``benchmarks/speed/gpu_results/``.

``--smoke`` runs every section at tiny sizes on the CPU when there is no GPU (the fused
kernels in Triton's interpreter, the torch kernels on torch's CPU device, GPT-2 models
of a few layers); ``tests/test_bench_gpu_check.py`` runs it. Without ``--smoke`` and without a
CUDA device, or without Triton, it is one line and exit code 2; so is a ``--json`` that
cannot be written (a missing directory, a directory, a device) or a ``--budget`` that is
not a number of seconds > 0, both refused before any work.
"""

from __future__ import annotations

import argparse
import importlib
import math
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from types import SimpleNamespace

from benchmarks.common import ROOT, one_line  # noqa: E402

from benchmarks.speed.gpu_wheels import WHEELS  # noqa: E402

SITE = ROOT / "benchmarks" / ".gpu-site"      # where missing packages are installed
# module -> distribution: what this script imports
REQUIRED = {"numpy": "numpy", "numba": "numba", "deap": "deap", "moocore": "moocore",
            "cffi": "cffi", "pycparser": "pycparser", "platformdirs": "platformdirs",
            "torch": "torch", "triton": "triton", "transformers": "transformers"}
TARGETS = {"token_node_evals_per_s": 3e11, "trace_speedup": 30.0, "recorder_vs_minimal": 0.5}
FULL = dict(token_rows=4_000_000, trees=1000, drafted=1_000_000, population=1000, repeats=3,
            torch_repeats=1, lengths=(64, 1024), batch=32, blocks=16, new_tokens=128,
            hf_repeats=3)
SMOKE = dict(token_rows=1000, trees=6, drafted=256, population=3, repeats=1,
             torch_repeats=1, lengths=(8, 32), batch=4, blocks=3, new_tokens=8, hf_repeats=1)


class CheckError(Exception):
    """One line, exit code 2."""


# ------------------------------------------------------------------ 1. packages

def missing(required=None) -> list:
    """The distributions of the modules this script needs (``REQUIRED``) that do not
    import."""
    required = REQUIRED if required is None else required
    return [dist for mod, dist in required.items() if importlib.util.find_spec(mod) is None]


def install(dists, wheels: Path, site: Path = SITE) -> None:
    """pip-install ``dists`` from the wheel folder alone (no index, no dependencies) into
    ``site``, which goes first on sys.path."""
    if not dists:
        return
    if not any(wheels.glob("*.whl")):
        raise CheckError(f"{', '.join(dists)} missing and no wheels in {wheels}: prepare "
                         "them with python -m benchmarks.speed.gpu_wheels where a package index "
                         "is reachable")
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps",
           "--find-links", str(wheels), "--target", str(site), *dists]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        last = (r.stderr.strip().splitlines() or ["no output"])[-1]
        raise CheckError(f"installing {', '.join(dists)} from {wheels} failed: {last}")
    sys.path.insert(0, str(site))
    importlib.invalidate_caches()
    still = missing({m: d for m, d in REQUIRED.items() if d in dists})
    if still:
        raise CheckError(f"{', '.join(still)} still does not import after installing it "
                         f"into {site}")


def bootstrap(wheels: Path) -> None:
    if SITE.is_dir() and str(SITE) not in sys.path:
        sys.path.insert(0, str(SITE))            # installed by an earlier check
        importlib.invalidate_caches()
    install(missing(), wheels)


# ------------------------------------------------------------------ 2.-4. kernels

def device(smoke: bool):
    """The torch device the check measures: CUDA, or the CPU with --smoke (the fused
    kernels then in Triton's interpreter, switched on before Triton is imported)."""
    import torch
    if torch.cuda.is_available():
        return torch.device("cuda")
    if not smoke:
        raise CheckError(f"no CUDA device (torch {torch.__version__}, built for CUDA "
                         f"{torch.version.cuda or 'none'}); --smoke checks the machinery "
                         "on the CPU")
    os.environ.setdefault("TRITON_INTERPRET", "1")
    return torch.device("cpu")


def probe(dev) -> str:
    """Why the fused kernels cannot be measured on ``dev`` ("" when they can): Triton
    cannot build them, or their compiled bits differ from the Numba interpreter's."""
    from evolve.kernels.gpu import DeviceError
    from evolve.kernels.gpu.choice import fused_for
    try:
        return fused_for(dev, "fused").probe(dev)
    except DeviceError as e:
        return str(e)
    except Exception as e:            # noqa: BLE001 (a compiler error of this Triton)
        traceback.print_exc()
        return one_line(e)


def kernels(sizes: dict, dev, sync, names=("fused", "torch")) -> dict:
    """The token and trace sections of ``gpu_eval`` with the kernels ``names``; a kernel
    that fails or gives other results than the Numba kernel is left out of the timing
    and named in the section's ``failed``."""
    from benchmarks.speed import gpu_eval
    args = SimpleNamespace(kernels=tuple(names), strict=False, **{k: sizes[k] for k in (
        "token_rows", "trees", "drafted", "population", "repeats", "torch_repeats")})
    return {"token": gpu_eval.token_section(args, dev, sync),
            "trace": gpu_eval.trace_section(args, dev, sync)}


# ------------------------------------------------------------------ 5.-6. Hugging Face

def hf_models(dev, sizes: dict):
    from benchmarks.speed.hf_speed import G, build_models
    kind = "llama" if dev.type == "cuda" else "smoke"
    need = max(sizes["lengths"]) + max(sizes["blocks"] * (G + 1), sizes["new_tokens"]) + 16
    return kind, build_models(kind, dev.type, need)


def recorder(models, dev, sizes: dict) -> dict:
    from benchmarks.speed.hf_speed import make_pair, measure
    target, draft = models
    pair = make_pair(target, draft, dev.type, sizes["batch"], sizes["blocks"])
    return {str(L): measure(pair, L, sizes["blocks"], sizes["hf_repeats"])
            for L in sizes["lengths"]}


def _dropin_module():
    """The standard rule exported as the transformers drop-in (``evolve export
    --format hf``), imported from a temporary file."""
    from evolve.export import modules
    from evolve.lang import treeio
    from evolve.rules.table import RULES
    source = modules.export_source(treeio.parse(RULES["standard_rejection"].tree()), "hf",
                                   {"metrics": {}}, "standard rejection (gpu_check)")
    path = Path(tempfile.mkdtemp()) / "standard_hf.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("gpu_check_standard_hf", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def dropin(models, dev, sizes: dict, sync) -> dict:
    """Tokens per second of ``generate`` with the assistant, transformers' own acceptance
    against the drop-in's, batch 1, ``new_tokens`` tokens, best of ``hf_repeats``
    (interleaved) at each prompt length."""
    import numpy as np
    import torch
    from benchmarks.speed.hf_speed import G
    target, draft = models
    for m in (target, draft):
        m.generation_config.eos_token_id = None          # always new_tokens tokens
        m.generation_config.pad_token_id = 0
    draft.generation_config.num_assistant_tokens = G
    draft.generation_config.num_assistant_tokens_schedule = "constant"
    draft.generation_config.assistant_confidence_threshold = 0.0
    mod = _dropin_module()
    n = sizes["new_tokens"]
    out = {}
    for L in sizes["lengths"]:
        before = dict(mod.STATS)
        prompt = torch.as_tensor(np.random.default_rng(L).integers(3, 256, (1, L)),
                                 device=dev)

        def generate():
            with torch.no_grad():
                target.generate(prompt, attention_mask=torch.ones_like(prompt),
                                assistant_model=draft, do_sample=True, top_k=0, top_p=1.0,
                                max_new_tokens=n)
        best = {"own": float("inf"), "dropin": float("inf")}
        for r in range(sizes["hf_repeats"] + 1):          # the first round warms up
            for name in best:
                if name == "dropin":
                    mod.install(prompt_length=L)
                try:
                    sync()
                    t = time.perf_counter()
                    generate()
                    sync()
                    if r:
                        best[name] = min(best[name], time.perf_counter() - t)
                finally:
                    if name == "dropin":
                        mod.uninstall()
        out[str(L)] = {"own_tokens_per_s": n / best["own"],
                       "dropin_tokens_per_s": n / best["dropin"],
                       "dropin_vs_own": best["own"] / best["dropin"],
                       "calls": mod.STATS["calls"] - before["calls"],
                       "accepted": mod.STATS["accepted"] - before["accepted"]}
    return out


# ------------------------------------------------------------------ the table

def _g(x: float) -> str:
    return f"{x:.3g}"


def _met(value: float, target: float, judged: bool) -> str:
    return ("yes" if value >= target else "no") if judged else "-"


def rows(doc: dict) -> list:
    """(what, figure, compared with, ratio, target, met) of every figure measured; the
    targets are judged on a GPU only (never with --smoke)."""
    out = []
    judged = doc["device"].startswith("cuda") and not doc["smoke"]
    k = doc.get("kernels") or {}
    tok, tr = k.get("token"), k.get("trace")
    if tok:
        what = f"token kernel, {tok['trees']:,} trees x {tok['rows']:,} rows"
        numba = tok["numba_node_evals_per_s"]
        t = TARGETS["token_node_evals_per_s"]
        for kern in ("fused", "torch"):
            if kern in tok.get("failed", {}):
                out.append((f"{what}: {kern}", "not timed", tok["failed"][kern], "", "", ""))
            elif f"{kern}_node_evals_per_s" in tok:
                rate = tok[f"{kern}_node_evals_per_s"]
                out.append((f"{what}: {kern}", f"{_g(rate)} node evals/s",
                            f"Numba, {doc['numba_threads']} threads: {_g(numba)}",
                            f"{rate / numba:.2f}x", f">= {t:.0e} node evals/s"
                            if kern == "fused" else "",
                            _met(rate, t, judged) if kern == "fused" else ""))
        out.append((f"{what}: Numba, {doc['numba_threads']} threads",
                    f"{_g(numba)} node evals/s", "", "", "", ""))
    if tr:
        what = (f"trace generation, {tr['population']:,} trees x {tr['drafted_tokens']:,} "
                f"drafted tokens")
        numba = f"Numba, {doc['numba_threads']} threads: {_g(tr['numba_generation_s'])} s"
        t = TARGETS["trace_speedup"]
        for kern in ("fused", "torch"):
            if kern in tr.get("failed", {}):
                out.append((f"{what}: {kern}", "not timed", tr["failed"][kern], "", "", ""))
            elif f"{kern}_generation_s" in tr:
                out.append((f"{what}: {kern}", f"{_g(tr[f'{kern}_generation_s'])} s", numba,
                            f"{tr[f'{kern}_speedup']:.2f}x faster",
                            f">= {t:.0f}x" if kern == "fused" else "",
                            _met(tr[f"{kern}_speedup"], t, judged) if kern == "fused" else ""))
    t = TARGETS["recorder_vs_minimal"]
    for L, res in (doc.get("recorder") or {}).items():
        minimal = res["minimal"]["total_tokens_per_s"]
        for name, label in (("record", "hf recorder"), ("free", "free-running")):
            r = res[name]
            out.append((f"{label}, {int(L):,}-token prompts, batch {doc['batch']}",
                        f"{r['total_tokens_per_s']:,.0f} drafted tokens/s",
                        f"minimal loop: {minimal:,.0f}",
                        f"{r['total_vs_minimal']:.2f} (steady {r['steady_vs_minimal']:.2f})",
                        f">= {t}" if name == "record" else "",
                        _met(r["total_vs_minimal"], t, judged) if name == "record" else ""))
    for L, res in (doc.get("dropin") or {}).items():
        out.append((f"drop-in in generate, {int(L):,}-token prompts, batch 1",
                    f"{res['dropin_tokens_per_s']:,.1f} new tokens/s",
                    f"transformers' own: {res['own_tokens_per_s']:,.1f}",
                    f"{res['dropin_vs_own']:.2f}", "", ""))
    for name, res in (doc.get("mining") or {}).items():
        what = {"builtin": "built-in task size", "7b": "7B shape"}.get(name, name)
        out.append((f"label mining, {what}, batch {res['batch']:,}",
                    f"{res['mining_rows_per_s']:,.0f} rows/s",
                    f"minimal loop: {res['minimal_rows_per_s']:,.0f} "
                    f"({res['minimal_needed_rows_per_s']:,.0f} needed)",
                    f"{res['mining_vs_minimal']:.2f}", "", ""))
        if "mining_peak_bytes" in res:
            out.append((f"label mining memory, {what}",
                        f"{res['mining_peak_bytes'] / 2 ** 30:,.2f} GiB peak",
                        f"estimate: {res['estimate_bytes'] / 2 ** 30:,.2f} GiB",
                        f"{res['mining_peak_vs_estimate']:.2f}", "", ""))
    for name, why in doc.get("not_run", {}).items():
        out.append((name, "not run", why, "", "", ""))
    for name, why in doc.get("failed", {}).items():
        out.append((name, "failed", why, "", "", ""))
    return out


def failures(doc: dict) -> dict:
    """What failed: the sections of ``doc["failed"]``, and each kernel that a kernel
    section left out of its timing (first reason only)."""
    out = dict(doc.get("failed", {}))
    for sec in (doc.get("kernels") or {}).values():
        for kern, why in sec.get("failed", {}).items():
            out.setdefault(f"{kern} kernel", why)
    return out


def table(doc: dict) -> str:
    head = ("what", "figure", "compared with", "ratio", "target", "met")
    body = rows(doc)
    widths = [max(len(str(r[i])) for r in [head] + body) for i in range(len(head))]
    line = lambda r: "  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip()  # noqa: E731
    return "\n".join([doc["title"], line(head), line(["-" * w for w in widths])]
                     + [line(r) for r in body])


def title(dev, smoke: bool) -> str:
    import numba
    import torch
    import triton
    name = (torch.cuda.get_device_name(dev) if dev.type == "cuda"
            else "no GPU: CPU only (--smoke; not GPU figures)")
    return (f"GPU check on {name}: torch {torch.__version__}, Triton {triton.__version__}, "
            f"CUDA {torch.version.cuda or 'none'}; {os.cpu_count()} CPU cores, Numba "
            f"{numba.get_num_threads()} threads" + ("; smoke sizes" if smoke else ""))


# ------------------------------------------------------------------ main

def run(args) -> dict:
    """Every section in turn; each one's figures go to ``--json`` as soon as it ends (a
    check stopped by a time limit keeps what it measured). A section that fails is named
    in ``failed`` with its reason (the traceback goes to stderr) and the others still
    run."""
    t0 = time.perf_counter()
    bootstrap(args.wheels)
    if importlib.util.find_spec("triton") is None:
        raise CheckError("triton does not import (torch's CUDA builds ship it; pip install "
                         "triton)")
    sizes = SMOKE if args.smoke else FULL
    dev = device(args.smoke)
    import numba
    import torch
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    doc = {"title": title(dev, args.smoke), "device": str(dev), "smoke": args.smoke,
           "numba_threads": numba.get_num_threads(), "cpu_count": os.cpu_count(),
           "batch": sizes["batch"], "targets": TARGETS, "not_run": {}, "failed": {}}
    note = lambda text: print(f"gpu_check [{time.perf_counter() - t0:5.0f} s]: {text}",  # noqa: E731
                              file=sys.stderr, flush=True)
    left = lambda: args.budget - (time.perf_counter() - t0)    # noqa: E731

    def save():
        doc["seconds"] = time.perf_counter() - t0
        if args.json:
            from evolve.io.atomic import atomic_write_text    # complete or not at all
            atomic_write_text(args.json, json.dumps(doc, indent=2, default=str) + "\n")

    def section(name, fn):
        """fn()'s result, or None with the failure recorded under ``name``."""
        try:
            return fn()
        except Exception as e:            # noqa: BLE001 (one section's failure)
            traceback.print_exc()
            doc["failed"][name] = one_line(e)
            return None
        finally:
            save()

    note(doc["title"])
    note("probing the fused kernels")
    why = probe(dev)
    names = ("fused", "torch")
    if why:
        doc["failed"]["fused kernels"] = why
        names = ("torch",)
    save()
    note("token and trace kernels (results compared with the Numba kernels first)")
    doc["kernels"] = section("kernels", lambda: kernels(sizes, dev, sync, names))
    models = None
    if left() > 0:
        note("Hugging Face recorder and free-running against the minimal loop")
        built = section("hf models", lambda: hf_models(dev, sizes))
        if built is not None:
            doc["models"], models = built
            doc["recorder"] = section("hf recorder", lambda: recorder(models, dev, sizes))
    else:
        doc["not_run"]["hf recorder"] = f"the {args.budget:.0f} s budget was spent"
    if models is not None and left() > 0:
        note("the exported drop-in inside generate")
        doc["dropin"] = section("drop-in in generate",
                                lambda: dropin(models, dev, sizes, sync))
    elif models is not None:
        doc["not_run"]["drop-in in generate"] = f"the {args.budget:.0f} s budget was spent"
    models = built = None                 # the Hugging Face section's models are freed
    if left() > 0:
        note("label mining against the minimal continuation loop")
        from benchmarks.speed import mining
        doc["mining"] = section("label mining",
                                lambda: mining.device_section(dev.type, args.smoke))
    else:
        doc["not_run"]["label mining"] = f"the {args.budget:.0f} s budget was spent"
    save()
    note("done")
    return doc


def check_options(args) -> None:
    """CheckError (one line) for a --budget that is not a number of seconds > 0 or a
    --json that cannot be written, before any work (the first save is minutes in)."""
    if not (math.isfinite(args.budget) and args.budget > 0):
        raise CheckError(f"--budget: {args.budget!r} is invalid; expected seconds > 0")
    if args.json is None:
        return
    from evolve.export.outfile import OutputError, check_target    # the project's checks
    try:
        path = check_target("--json", args.json)
    except OutputError as e:
        raise CheckError(str(e)) from None
    if not os.access(path.parent, os.W_OK | os.X_OK) or (path.exists()
                                                         and not os.access(path, os.W_OK)):
        raise CheckError(f"--json: {path}: not writable")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--smoke", action="store_true",
                    help="tiny sizes; on the CPU when there is no GPU")
    ap.add_argument("--json", type=str, default=None, help="write every figure here")
    ap.add_argument("--wheels", type=Path, default=WHEELS,
                    help="wheels of what the machine lacks (benchmarks/speed/gpu_wheels.py)")
    ap.add_argument("--budget", type=float, default=420.0,
                    help="seconds after which no further section starts")
    args = ap.parse_args(argv)
    try:
        check_options(args)
        if args.json is not None:
            args.json = Path(args.json)
        doc = run(args)
    except CheckError as e:
        print(f"gpu_check: {e}", file=sys.stderr)
        return 2
    print(table(doc))
    if doc["smoke"]:
        print("smoke sizes: the machinery is checked, no target is judged")
    failed = failures(doc)
    if failed:
        print("failed: " + "; ".join(f"{k}: {v}" for k, v in failed.items()))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
