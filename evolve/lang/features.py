"""The one table of inputs a rule reads, in signature order.

(name in trees and code, short name in infix text, type). The kernel's opcode
of an input is its index here. The first six are the original record's
features and the reference signature of every heuristic; the others exist
on speculative-decoding traces: the position inside the draft block (0-based),
the target's and the draft's top probability (schema v2), then three slot
features of schema v3 (``evolve.data.decode.slot_features``: TV(p, q), KL(p||q),
KL(q||p); the fourth, #{x: q(x) > p(x)}, is recorded but not an input), then two
lookahead features (``evolve.data.decode.lookahead_features``): what verification
knows at slot j of the later drafted slots of the same block, since the target
scores all of them in one pass. ``next_tv`` is the slot TV of slot j + 1 (0 at the
block's last slot, where an acceptance is followed by the bonus token), ``ahead``
the expected number of later drafts of the block the standard rule would accept
after an acceptance at j. Both are computed along the drafted tokens, so they
depend on the token drafted at j: the exact objectives, which sum over the draft's
candidates at j, hold them fixed at the recorded draft's values, and a rule that
reads them is scored by an estimate (``evolve run --lookahead``; the free-running
comparison decides). Inputs are appended so that trees and checkpoints written
before them still parse. Splits without slot features (v2 files whose candidates
miss some mass) offer neither the slot nor the lookahead inputs
(``evolve.objectives.spec.TraceArrays``). ``TRACE_INPUT_NAMES`` are the nine of a
v2 trace (the signature of trace rules that read no slot feature),
``SLOT_SIGNATURE`` the twelve of a rule that reads a slot feature but no lookahead,
``ALL_INPUT_NAMES`` all fourteen. Token splits, traces, the primitive set,
generated code and reports all read this table (it imports nothing, so data
modules can use it without loading Numba).
"""

INPUTS = (
    ("draft_prob", "d", float),
    ("target_prob", "t", float),
    ("position", "pos", float),
    ("draft_entropy", "de", float),
    ("target_entropy", "te", float),
    ("top_token_match", "match", bool),
)
TRACE_INPUTS = (
    ("block_position", "bpos", float),
    ("p_max", "pmax", float),
    ("q_max", "qmax", float),
    ("slot_tv", "stv", float),
    ("slot_kl_pq", "klpq", float),
    ("slot_kl_qp", "klqp", float),
    ("next_tv", "ntv", float),
    ("ahead", "ahead", float),
)
SLOT_INPUT_NAMES = ("slot_tv", "slot_kl_pq", "slot_kl_qp")
LOOKAHEAD_INPUT_NAMES = ("next_tv", "ahead")
ALL_INPUTS = INPUTS + TRACE_INPUTS
N_V2_INPUTS = (len(ALL_INPUTS) - len(SLOT_INPUT_NAMES)
               - len(LOOKAHEAD_INPUT_NAMES))             # the inputs of v2 traces: 9
N_SLOT_INPUTS = N_V2_INPUTS + len(SLOT_INPUT_NAMES)      # with the slot features: 12
INPUT_NAMES = tuple(i[0] for i in INPUTS)
ALL_INPUT_NAMES = tuple(i[0] for i in ALL_INPUTS)         # fourteen, in opcode order
TRACE_INPUT_NAMES = ALL_INPUT_NAMES[:N_V2_INPUTS]         # the nine of a v2 trace signature
SLOT_SIGNATURE = ALL_INPUT_NAMES[:N_SLOT_INPUTS]          # the twelve of a slot rule


# What each input may hold, the values a recorder can give it (``evolve.Rule`` refuses
# anything else, in one line naming the input): "prob" a probability in [0, 1]; "draft"
# the draft's probability of the drafted token, in (0, 1] (it was drawn from the draft);
# "tv" a total variation, in [0, 1]; "nonneg" a finite number >= 0 (entropies, KL
# divergences, an expected count); "whole" a whole number >= 0 (positions); "bool"
# True or False (or 1 and 0).
DOMAINS = {"draft_prob": "draft", "target_prob": "prob", "position": "whole",
           "draft_entropy": "nonneg", "target_entropy": "nonneg", "top_token_match": "bool",
           "block_position": "whole", "p_max": "prob", "q_max": "prob", "slot_tv": "tv",
           "slot_kl_pq": "nonneg", "slot_kl_qp": "nonneg", "next_tv": "tv", "ahead": "nonneg"}

if set(DOMAINS) != set(ALL_INPUT_NAMES):
    raise ImportError("evolve.lang.features: every input needs its DOMAINS entry")
if ALL_INPUT_NAMES[N_V2_INPUTS:N_SLOT_INPUTS] != SLOT_INPUT_NAMES or \
        ALL_INPUT_NAMES[N_SLOT_INPUTS:] != LOOKAHEAD_INPUT_NAMES:
    raise ImportError("evolve.lang.features: the slot and lookahead inputs are out of order")


def reads_any(nodes, names) -> bool:
    """Whether parsed tree nodes (``evolve.lang.treeio``) read any of the inputs ``names``."""
    return any(getattr(n, "kind", None) == "input" and n.name in names for n in nodes)
