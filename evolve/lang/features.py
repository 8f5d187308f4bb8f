"""The input registry: every input a rule reads, declared once, in opcode order.

An input is one ``Input`` row: its name (in trees and code), its short name (in infix
text), its type, its group (which data holds it, below), a one-line description, and
its export expression (``engine``: torch over the tensors an engine format's glue
holds, ``evolve.export.engines``). How it is computed lives in one module,
``evolve.data.inputs``: from the full draft and target distributions at drafted slots
(every decoder and recorder, in numpy and torch), and from a trace's recorded columns
(the objectives' input matrices). The kernel's opcode of an input is its index here.
Everything that reads inputs iterates this table: the primitive set, the input
matrices, the decoders, the rule adapters, the learned rules, generated code and the
exports; nothing reads an input by its position.

Groups, in table order; an input is offered to a search where its group's data is:

- ``token``: the six features of the original record (every data world);
- ``trace``: where the draft block stands and the top probabilities (every trace);
- ``slot``: TV(p, q), KL(p||q), KL(q||p) of the slot's full distributions (traces
  that record them, schema v3, or whose candidates hold all the mass;
  ``evolve.data.decode.slot_features``);
- ``lookahead``: what verification knows at slot j of the later drafted slots of its
  block (computed from their slot TVs along the drafted tokens,
  ``evolve.data.decode.lookahead_features``), so the exact objectives hold them at
  the recorded draft's values and a rule that reads them is scored by an estimate
  (``evolve run --lookahead`` offers them; the free-running comparison decides);
- ``rank``: the drafted token's rank in the target's distribution (traces that record
  it, schema v4, and every decoder: it needs the full target distribution); offered
  where both splits of a run record it;
- ``vocab``: the drafted token's class in the pair's vocabulary (word, number,
  punctuation, other; ``evolve.data.vocab_class``): traces whose meta carries the
  pair's table, and every decoder given its pair; offered where both splits carry it;
- ``answer`` (the task world): the drafted token's log-probability margin below the
  target's top token, and the drafts accepted so far in the answer that were not the
  target's top token (path-dependent: held at the recorded path's values offline);
- ``verify`` (the task world): how many of the block's later drafts in a row are the
  target's top token (path-dependent, as the lookahead group).

A group ``needs`` the groups it is computed from (lookahead: slot). A rule's signature
(generated code and exports) is its world's own groups (token; token and trace on
traces) plus every group it reads and what those need, in table order
(``signature_of``). Trees, checkpoints and exports name their inputs, and opcodes and
input matrices are made from the table when a run starts, so a group may be inserted
where its data belongs (the trace world's groups first: its input matrices then have
no empty rows); the kernels reserve ``MAX_INPUTS`` opcodes (``evolve.lang.primitives``).

This module imports nothing, so data modules can read it without loading Numba.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Input:
    name: str            # in trees and generated code
    short: str           # in infix text
    type: type           # float, or bool (a truth value: the kernel holds 1.0 / 0.0)
    group: str           # a key of GROUPS
    per_token: bool      # its value depends on the token (else one value per slot)
    doc: str             # what it is, in a line
    engine: str | None   # torch expression in an engine format's glue (None: not exported)
    domain: str = "nonneg"   # the values it may hold (DOMAIN_KINDS; evolve.Rule checks)


# group: (what data holds it, the groups it is computed from)
GROUPS = {
    "token": ("every data world: the original record's features", ()),
    "trace": ("speculative-decoding traces", ()),
    "slot": ("traces with the slot features (schema v3, or candidates holding all the mass)",
             ()),
    "lookahead": ("traces with the slot features, offered with --lookahead", ("slot",)),
    "rank": ("traces that record the target's ranks (schema v4)", ()),
    "vocab": ("traces whose meta carries the pair's vocabulary classes", ()),
    "answer": ("task traces: where the drafted token stands and what the answer has "
               "accepted so far", ()),
    "verify": ("task traces: what verification knows of the block's later drafts", ()),
}
# Groups whose inputs depend on the path decoding takes (later drafts of the block, or
# what earlier blocks accepted): the exact objectives hold them at the recorded path's
# values, so a rule that reads one is scored by an estimate, and free-running decoding
# decides (``evolve.data.inputs`` computes them along the path each decoder takes)
PATH_GROUPS = ("lookahead", "verify")
PATH_INPUTS = ("mismatches",)        # of the answer group: along the answer so far

# Engine expressions read the glue's tensors (evolve.export.engines): p, q the target's
# and the draft's probabilities [n, vocab] at the n drafted positions, x the drafted
# tokens [n], rows = arange(n), block and position the block and sequence positions
# (floats), and slots the slot features and lookahead inputs of those positions.
REGISTRY: tuple[Input, ...] = (
    Input("draft_prob", "d", float, "token", True,
          "the draft's probability of the drafted token", "q[rows, x]", domain="draft"),
    Input("target_prob", "t", float, "token", True,
          "the target's probability of the drafted token", "p[rows, x]", domain="prob"),
    Input("position", "pos", float, "token", False,
          "tokens generated before it (0-based; the distance from the prompt)", "position",
          domain="whole"),
    Input("draft_entropy", "de", float, "token", False,
          "entropy of the draft's distribution (nats)", "entropy(q)", domain="nonneg"),
    Input("target_entropy", "te", float, "token", False,
          "entropy of the target's distribution (nats)", "entropy(p)", domain="nonneg"),
    Input("top_token_match", "match", bool, "token", True,
          "the drafted token is the target's most probable one", "x == p.argmax(dim=-1)",
          domain="bool"),
    Input("block_position", "bpos", float, "trace", False,
          "its place in the draft block (0-based)", "block", domain="whole"),
    Input("p_max", "pmax", float, "trace", False, "the target's top probability",
          "p.max(dim=-1).values", domain="prob"),
    Input("q_max", "qmax", float, "trace", False, "the draft's top probability",
          "q.max(dim=-1).values", domain="prob"),
    Input("slot_tv", "stv", float, "slot", False,
          "TV(p, q) at the slot: the standard rule's rejection probability",
          'slots["slot_tv"]', domain="tv"),
    Input("slot_kl_pq", "klpq", float, "slot", False, "KL(p || q) at the slot",
          'slots["slot_kl_pq"]', domain="nonneg"),
    Input("slot_kl_qp", "klqp", float, "slot", False, "KL(q || p) at the slot",
          'slots["slot_kl_qp"]', domain="nonneg"),
    Input("next_tv", "ntv", float, "lookahead", False,
          "the next slot's TV in the block (0 at its last slot)", 'slots["next_tv"]', domain="tv"),
    Input("ahead", "ahead", float, "lookahead", False,
          "expected later drafts of the block the standard rule accepts after this one",
          'slots["ahead"]', domain="nonneg"),
    Input("target_rank", "rank", float, "rank", True,
          "tokens the target finds more probable than the drafted one (0: its top token; "
          "TensorRT-LLM's relaxed_topk keeps a draft of rank below topk)",
          "(p > p[rows, x].unsqueeze(-1)).sum(dim=-1).to(p.dtype)", domain="whole"),
    Input("token_class", "cls", float, "vocab", True,
          "the drafted token's class in the vocabulary: 0 word, 1 number, 2 punctuation, "
          "3 other (white space, special tokens; evolve.data.vocab_class)",
          "classes[x].to(p.dtype)", domain="class"),
    Input("logp_margin", "margin", float, "answer", True,
          "log p_max - log p(token): how far the drafted token is below the target's top "
          "one (TensorRT-LLM's relaxed_delta reads it)",
          "torch.log(p.max(dim=-1).values) - torch.log(p[rows, x])", domain="nonneg"),
    Input("mismatches", "mism", float, "answer", False,
          "drafts accepted so far in this answer that were not the target's top token "
          "(this block's earlier drafts included)", None, domain="whole"),
    Input("next_matches", "nmatch", float, "verify", False,
          "the later drafts of the block, in a row, that are the target's top token (FLy's "
          "deferred window reads it)", None, domain="whole"),
)

BY_NAME: dict[str, Input] = {i.name: i for i in REGISTRY}

# What an input may hold, the values a recorder can give it (``evolve.Rule`` refuses
# anything else, in one line naming the input: ``evolve.api.rule_inputs``), by kind:
# (what is expected, in words; the lowest value; whether it is excluded; the highest).
# "draft" is the draft's probability of the drafted token (it was drawn from the draft);
# a total variation summed in floating point may round a hair above 1; "whole" values
# are whole numbers; "bool" takes True/False or 1/0.
TV_TOL = 1e-9
DOMAIN_KINDS = {
    "prob": ("probabilities in [0, 1]", 0.0, False, 1.0),
    "draft": ("probabilities in (0, 1] (the draft's probability of a token drawn from it)",
              0.0, True, 1.0),
    "tv": ("total variations in [0, 1]", 0.0, False, 1.0 + TV_TOL),
    "nonneg": ("finite numbers >= 0", 0.0, False, float("inf")),
    "real": ("finite numbers", float("-inf"), True, float("inf")),
    "whole": ("whole numbers >= 0", 0.0, False, float("inf")),
    "bool": ("booleans (True/False, or 1/0)", 0.0, False, 1.0),
    "class": ("token classes 0, 1, 2 or 3", 0.0, False, 3.0),
}
DOMAINS = {i.name: i.domain for i in REGISTRY}
if len(BY_NAME) != len(REGISTRY) or any(i.group not in GROUPS for i in REGISTRY) \
        or any(i.domain not in DOMAIN_KINDS for i in REGISTRY) \
        or [i.group for i in REGISTRY] != sorted((i.group for i in REGISTRY),
                                                  key=list(GROUPS).index):
    raise ImportError("evolve.lang.features: an input is repeated, of an unknown group, or "
                      "out of its group's order")


def names_of(*groups: str) -> tuple:
    """The inputs of these groups, in table order."""
    return tuple(i.name for i in REGISTRY if i.group in groups)


def with_needs(groups) -> set:
    """The groups and every group they are computed from."""
    out, todo = set(), list(groups)
    while todo:
        g = todo.pop()
        if g not in out:
            out.add(g)
            todo.extend(GROUPS[g][1])
    return out


# The table as (name, short name, type) rows, and the groups' names (the readers of
# before the registry, and the ones that want a group by name)
ALL_INPUTS = tuple((i.name, i.short, i.type) for i in REGISTRY)
INPUTS = tuple(r for r, i in zip(ALL_INPUTS, REGISTRY) if i.group == "token")
TRACE_INPUTS = tuple(r for r, i in zip(ALL_INPUTS, REGISTRY) if i.group != "token")
INPUT_NAMES = names_of("token")                              # the six of a token record
SLOT_INPUT_NAMES = names_of("slot")
LOOKAHEAD_INPUT_NAMES = names_of("lookahead")
ALL_INPUT_NAMES = tuple(i.name for i in REGISTRY)            # every input, in opcode order
TRACE_INPUT_NAMES = names_of("token", "trace")               # the nine of a v2 trace signature
TOKEN_LEVEL = tuple(i.name for i in REGISTRY if i.per_token)   # those that vary with the token
SLOT_SIGNATURE = names_of("token", "trace", "slot")          # the twelve of a slot rule
N_V2_INPUTS = len(TRACE_INPUT_NAMES)
N_SLOT_INPUTS = len(SLOT_SIGNATURE)


def groups_read(nodes) -> set:
    """The groups of the inputs parsed tree nodes (``evolve.lang.treeio``) read."""
    return {BY_NAME[n.name].group for n in nodes if getattr(n, "kind", None) == "input"}


def reads_any(nodes, names) -> bool:
    """Whether parsed tree nodes (``evolve.lang.treeio``) read any of the inputs ``names``."""
    return any(getattr(n, "kind", None) == "input" and n.name in names for n in nodes)


def signature(groups) -> tuple:
    """The inputs of ``groups`` and of what they need, in table order."""
    return names_of(*with_needs(groups))


def signature_of(nodes, trace: bool = True) -> tuple:
    """The signature of the rule whose tree is ``nodes`` (generated code and exports):
    its world's groups (token; token and trace with ``trace``) and every group it reads,
    with what those need."""
    return signature({"token"} | ({"trace"} if trace else set()) | groups_read(nodes))


def offered(trace: bool = False, slots: bool = True, lookahead: bool = False,
            extra=(), ranks: bool = False) -> tuple:
    """The inputs data of a kind offers a search, in table order: the token group; on
    traces also the trace group and, with ``slots`` (the split has them), the slot
    group, and with ``lookahead`` (and ``slots``) the lookahead group, and with
    ``ranks`` (the split records them) the rank group; and the groups ``extra`` (a
    world's own: the task world's answer and verify groups)."""
    groups = {"token", *extra}
    if trace:
        groups.add("trace")
        if slots:
            groups.add("slot")
            if lookahead:
                groups.add("lookahead")
        if ranks:
            groups.add("rank")
    return names_of(*groups)
