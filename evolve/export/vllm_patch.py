"""``evolve export --format vllm-patch``: a unified diff against one vLLM release.

vLLM has no plug-in point for the acceptance test, so the rule goes in as a
patch. It targets one pinned release (``RELEASE``): the file
``vllm/v1/sample/rejection_sampler.py`` of the vLLM 0.33.0 sdist (sha256 of the
file ``FILE_SHA256``), function ``rejection_random_sample_kernel`` (the Triton
kernel of the V1 model runner's rejection sampler, random-sampling requests).
Its accept line

    accepted = draft_prob > 0 and target_prob / draft_prob >= uniform_prob

and the two comment lines above it are replaced by the rule, computed in the
kernel in float64 from the values the kernel holds at that point:
``draft_prob`` (q(x); 1 when the drafter gives no probabilities),
``target_prob`` (p(x)) and ``pos`` (the drafted token's place in its request's
block, ``block_position``), then ``accepted = uniform_prob < h``. A rule that
reads any other input (the sequence position, entropies, p_max, q_max,
top_token_match: vocabulary reductions the kernel does not have) is refused in
one line naming the input. Padded drafts (id < 0), the synthetic mode, greedy
requests and the recovered-token sampler are left as they are.

The diff is built without the release at hand from ``EXCERPT``: the replaced
lines and three lines of context either side, as they stand at ``EXCERPT_LINE``
of that file (``tests/test_vllm_patch.py`` checks them against the downloaded
release). ``patch_lines`` builds the same hunk from any text holding the
replaced lines once.
"""

from __future__ import annotations

from evolve.export.backends import Backend
from evolve.export.engines import settings_lines
from evolve.export.scope import scope_lines as scope_text
from evolve.export.modules import ExportError, check_format
from evolve.lang import codegen
from evolve.lang import primitives as P
from evolve.lang.treeio import render

FORMAT = "vllm-patch"
RELEASE = "0.33.0"
PATH = "vllm/v1/sample/rejection_sampler.py"
KERNEL = "rejection_random_sample_kernel"
FILE_SHA256 = "9f035dd0c5af33b29ffcc63e2192f7b2fb85f8a6b4ac89275ecb5698f7ca2ff1"
SDIST_URL = ("https://files.pythonhosted.org/packages/f7/25/aa5684e9c59d6fc75f78926b7f15e8d9"
             "adc7de2d9e6e7575b80776ad8169/vllm-0.33.0.tar.gz")
SDIST_SHA256 = "f4c33c2503d52bb411146afa9618a4f48bed68912f617e6803ac8d76e4c74112"
SDIST_MEMBER = f"vllm-{RELEASE}/{PATH}"

# The kernel's names for the inputs it holds (the rest are refused).
KERNEL_INPUTS = {"draft_prob": "draft_prob", "target_prob": "target_prob",
                 "block_position": "pos"}
INDENT = " " * 16
REPLACED = (
    INDENT + "# NOTE(woosuk): While the draft probability should never be 0,",
    INDENT + "# we check it to avoid NaNs. If it happens to be 0, we reject.",
    INDENT + "accepted = draft_prob > 0 and target_prob / draft_prob >= uniform_prob",
)
CONTEXT = 3
EXCERPT_LINE = 946          # 1-based line of EXCERPT[0] in the release's file
EXCERPT = (
    INDENT + "target_prob = tl.load(",
    INDENT + "    target_probs_ptr + (start_idx + pos) * vocab_size + draft_token_id",
    INDENT + ")",
) + REPLACED + (
    " " * 12 + "if accepted:",
    INDENT + "token_id = draft_token_id",
    " " * 12 + "else:",
)


TRITON = Backend("triton", "triton.language", "tl",
                 {p.name: p.exports["triton"] for p in P.PRIMITIVES}, helpers={})


def rule_lines(nodes) -> tuple[list[str], str]:
    """The rule as Triton statements over the kernel's variables: (lines, result).
    Inputs are first widened to float64 (``rule_<input>``); every primitive node is
    one assignment to ``rule_<n>``."""
    check_format(FORMAT, nodes)
    read = [n for n in P.TRACE_INPUT_NAMES if any(x.kind == "input" and x.name == n
                                                    for x in nodes)]
    lines = [f"rule_{name} = {KERNEL_INPUTS[name]} + tl.zeros([], tl.float64)"
             for name in read]
    count = [0]

    def leaf(n):
        return P.f64(n.value) if n.kind == "const" else f"rule_{n.name}"

    def prim(n, args):
        var = f"rule_{count[0]}"
        count[0] += 1
        lines.append(f"{var} = {TRITON.templates[n.name].format(*args)}")
        return var

    return lines, render(nodes, leaf, prim)


RANK_CHUNK = 1024      # vocabulary entries read per step of the rank loop (a power of 2)


def scope_lines(scope: dict | None) -> list[str]:
    """Kernel lines that set ``rule_in_scope``: the draft's block position is below the
    scored draft length and, with a top-k scope and draft probabilities, its rank under
    the draft's probabilities (``draft_probs`` row; ties: lower id first, as the traces
    took their candidates) is below k. [] for a rule with no scope."""
    if scope is None:
        return []
    out = [f"rule_in_scope = pos < {int(scope['block_size'])}"]
    k = scope.get("top_k")
    if k is not None:
        out += [
            "if not NO_DRAFT_PROBS:",
            "    rule_rank = tl.zeros([], tl.int64)",
            f"    for rule_v in range(0, vocab_size, {RANK_CHUNK}):",
            f"        rule_ids = rule_v + tl.arange(0, {RANK_CHUNK})",
            "        rule_q = tl.load(draft_probs_ptr + (start_idx + pos) * vocab_size + rule_ids,",
            "                         mask=rule_ids < vocab_size, other=0.0)",
            "        rule_rank += tl.sum(((rule_q > draft_prob) | ((rule_q == draft_prob)",
            "                             & (rule_ids < draft_token_id))).to(tl.int64))",
            f"    rule_in_scope = rule_in_scope & (rule_rank < {int(k)})",
        ]
    return out


def replacement(nodes, scope: dict | None = None) -> list[str]:
    """The lines that take the place of ``REPLACED`` in the kernel: the rule decides
    drafts inside the scope it was scored with (``scope``, ``evolve.data.traces.scope_of``),
    the kernel's own test the others."""
    lines, result = rule_lines(nodes)
    body = [
        f"# Acceptance rule from evolve export --format {FORMAT} (replaces",
        "# 'draft_prob > 0 and target_prob / draft_prob >= uniform_prob'):",
        f"# h = {codegen.sanitise(codegen.infix(nodes), 2000)}",
        "# (d = draft_prob, t = target_prob, bpos = pos), computed in float64;",
        "# the draft is accepted iff uniform_prob < h",
    ]
    if scope is None:
        return [INDENT + line for line in body[:-1] + [body[-1] + "."] + lines
                + [f"accepted = uniform_prob < {result}"]]
    k = scope.get("top_k")
    body[-1] += (f" where the rule was scored: block positions below {scope['block_size']}"
                 + ("" if k is None else f" and drafts among the draft's top {k} tokens "
                    "(rank under draft_probs; ties: lower id first)") + ";")
    body += ["# the kernel's own test decides the others."]
    body += lines + scope_lines(scope) + [
        "rule_std = draft_prob > 0 and target_prob / draft_prob >= uniform_prob",
        f"accepted = tl.where(rule_in_scope, uniform_prob < {result}, rule_std)"]
    return [INDENT + line for line in body]


def locate(lines) -> int:
    """The index of ``REPLACED`` in ``lines``; ExportError unless it is there exactly
    once with ``CONTEXT`` lines either side."""
    n = len(REPLACED)
    hits = [i for i in range(len(lines) - n + 1) if tuple(lines[i:i + n]) == REPLACED]
    if len(hits) != 1:
        raise ExportError(f"{PATH}: the accept test of {KERNEL} "
                          f"({REPLACED[-1].strip()!r}) is found {len(hits)} times, expected "
                          f"once: not the vLLM {RELEASE} file")
    i = hits[0]
    if i < CONTEXT or i + n + CONTEXT > len(lines):
        raise ExportError(f"{PATH}: the accept test of {KERNEL} has less than {CONTEXT} "
                          "lines of context")
    return i


def patch_lines(lines, nodes, first_line: int = 1, scope: dict | None = None) -> list[str]:
    """The unified diff (file headers and one hunk) that replaces ``REPLACED`` in
    ``lines`` (the file's lines, or an excerpt of it whose first line is line
    ``first_line`` of the file) by the rule."""
    lines = [line.rstrip("\n") for line in lines]
    i = locate(lines)
    new = replacement(nodes, scope)
    before = lines[i - CONTEXT:i]
    after = lines[i + len(REPLACED):i + len(REPLACED) + CONTEXT]
    start = first_line + i - CONTEXT
    old_len = len(before) + len(REPLACED) + len(after)
    new_len = len(before) + len(new) + len(after)
    return ([f"--- a/{PATH}", f"+++ b/{PATH}", f"@@ -{start},{old_len} +{start},{new_len} @@ "
             f"def {KERNEL}("]
            + [" " + x for x in before] + ["-" + x for x in REPLACED]
            + ["+" + x for x in new] + [" " + x for x in after])


def patch_source(nodes, metadata: dict, title: str) -> str:
    """The patch file: a commented header (provenance, the release, how to apply it),
    then the diff against the release's file, built from ``EXCERPT``."""
    sc = metadata.get("scope")
    diff = patch_lines(EXCERPT, nodes, EXCERPT_LINE, sc)
    header = codegen.provenance(nodes, metadata, title,
                                f"`evolve export --format {FORMAT}`")
    header += scope_text(sc) + settings_lines(FORMAT, sc)
    header += [
        "",
        f"A patch for vLLM {RELEASE} (only): {PATH}, {KERNEL},",
        f"the file with sha256 {FILE_SHA256}.",
        "It replaces the kernel's accept test by the rule above (random-sampling",
        "requests of the V1 model runner; vLLM 0.33.0 picks the V2 runner by default:",
        "set VLLM_USE_V2_MODEL_RUNNER=0). Apply it in the directory that holds vllm/",
        "(a source tree, or site-packages):  patch -p1 --fuzz=0 < THIS_FILE",
    ]
    if any(line.startswith(("---", "+++", "@@")) for line in header):
        raise ExportError(f"{title}: a header line reads as a diff line")
    return "".join(f"# {line}".rstrip() + "\n" for line in header) + \
        "".join(line + "\n" for line in diff)


def apply(text: str, nodes, scope: dict | None = None) -> str:
    """``text`` (the release's file) with the rule in place of the accept test: what
    ``patch -p1`` makes of it with the exported diff."""
    lines = text.split("\n")
    i = locate(lines)
    return "\n".join(lines[:i] + replacement(nodes, scope) + lines[i + len(REPLACED):])
