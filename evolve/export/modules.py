"""One exported module: provenance header, METADATA, constants, the rule, engine glue.

Formats: ``numpy`` and ``torch`` (``threshold`` and ``accept`` over arrays or
tensors of any shape), ``hf`` (torch, plus a drop-in for transformers'
``_speculative_sampling``) and ``vllm`` (torch, plus the accept line of vLLM's
rejection sampler over [num_tokens] tensors). The text is compiled, never run,
before it is returned. ``vllm-patch`` (``PATCHES``) is not a module but a diff
against one vLLM release (``evolve.export.vllm_patch``); its inputs are checked
here too.
"""

from __future__ import annotations

from evolve.errors import EvolveError
from evolve.export import arrays, engines, formats, scope
from evolve.export.backends import BACKENDS
from evolve.lang import codegen

FORMATS = formats.MODULES                         # module formats
PATCHES = formats.PATCHES                         # diff formats (evolve.export.vllm_patch)


class ExportError(EvolveError):
    """A champion that cannot be exported to a format, or an unknown format (one line)."""


def check_format(fmt: str, nodes) -> None:
    """Raise ExportError for an unknown format or inputs the format cannot compute."""
    known = FORMATS + PATCHES
    if fmt not in known:
        raise ExportError(f"--format: {fmt!r} is invalid; expected one of {', '.join(known)}")
    provided = engines.PROVIDES[fmt]
    if provided is None:
        return
    missing = sorted({n.name for n in nodes if n.kind == "input"} - set(provided))
    if missing:
        able = [f for f in FORMATS + PATCHES if engines.PROVIDES[f] is None
                or not set(missing) - set(engines.PROVIDES[f])]
        what = (f"vLLM's rejection kernel does not hold (it holds {', '.join(provided)})"
                if fmt in PATCHES else f"{fmt} cannot provide")
        raise ExportError(f"--format {fmt}: the champion reads {', '.join(map(repr, missing))}, "
                          f"which {what} (formats that can: {', '.join(able)})")


GREEDY_FORMATS = formats.GREEDY     # the formats a greedy-decoding rule exports to


def check_decoding(fmt: str, scope: dict | None, title: str = "the champion") -> None:
    """ExportError (one line) for a rule scored in greedy decoding and an engine format:
    transformers' greedy assisted decoding and vLLM's greedy verification keep a draft
    iff it is the target's argmax, inside code that has no place for a rule; and for a
    sampled rule whose traces do not record their temperature and an engine format,
    which must set one."""
    if (scope or {}).get("decoding") == "greedy" and fmt not in GREEDY_FORMATS:
        raise ExportError(f"--format {fmt}: {title} was scored in greedy decoding, which "
                          f"{'transformers' if fmt == 'hf' else 'vLLM'} verifies by exact "
                          "argmax match with no place for a rule; export it with --format "
                          "numpy or torch (their acceptance keeps the target's argmax drafts)")
    if scope is not None and scope.get("decoding") != "greedy" \
            and scope.get("temperature") is None and fmt not in GREEDY_FORMATS:
        raise ExportError(f"--format {fmt}: {title}'s traces do not record the temperature "
                          f"they were sampled at, so {'transformers' if fmt == 'hf' else 'vLLM'}"
                          " cannot be set to decode as the rule was scored; add it to the "
                          "scope in the run's champion.json (\"temperature\": the traces' "
                          "sampling temperature), or export with --format numpy or torch")


def export_source(nodes, fmt: str, metadata: dict, title: str) -> str:
    """The complete module text of ``nodes`` in format ``fmt`` (a module format)."""
    check_format(fmt, nodes)
    check_decoding(fmt, metadata.get("scope"))
    if fmt not in FORMATS:
        raise ExportError(f"--format {fmt}: a patch, not a module (evolve.export.vllm_patch)")
    trace = codegen.uses_trace_inputs(nodes)
    inputs = codegen.P.signature_of(nodes, trace)
    backend = BACKENDS[formats.FORMATS[fmt].backend]
    meta = {**metadata, "format": fmt, "inputs": list(inputs)}
    header = codegen.provenance(nodes, meta, title,
                                f"`evolve export --format {fmt}`; needs "
                                f"{formats.FORMATS[fmt].needs} only "
                                "(nothing of the exporting project).")
    header.append(f"Inputs: {', '.join(inputs)}")
    sc = metadata.get("scope")
    header += scope.scope_lines(sc) + engines.settings_lines(fmt, sc)
    doc = "\n".join(header)
    source = (f'"""{doc}\n"""\n\n'
              f"import {backend.module}" + (f" as {backend.alias}" if backend.alias !=
                                            backend.module else "") + "\n\n"
              f"METADATA = {codegen.python_literal(meta)}\n\n"
              f"{arrays.constants_source()}"
              f"{scope.scope_constants(sc)}"
              f"{arrays.threshold_source(nodes, backend, inputs)}"
              f"{scope.scope_source(sc, backend, inputs)}"
              f"{engines.engine_source(fmt, inputs)}")
    compile(source, f"<export {fmt}>", "exec")
    return source
