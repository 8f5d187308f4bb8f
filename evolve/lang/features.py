"""The one table of inputs a rule reads, in signature order.

(name in trees and code, short name in infix text, type). The kernel's opcode
of an input is its index here. The first six are the original record's
features and the reference signature of every heuristic; the others exist
on speculative-decoding traces: the position inside the draft block (0-based),
the target's and the draft's top probability (schema v2), then three slot
features of schema v3 (``evolve.data.decode.slot_features``: TV(p, q), KL(p||q),
KL(q||p); the fourth, #{x: q(x) > p(x)}, is recorded but not an input: the
kernel reserves twelve input opcodes), appended so that trees and checkpoints
written before them still parse. Splits without slot features (v2 files whose
candidates miss some mass, shards) do not offer the slot inputs
(``evolve.objectives.spec.SpecArrays``). ``TRACE_INPUT_NAMES`` are the nine
of a v2 trace (the signature of trace rules that read no slot feature),
``ALL_INPUT_NAMES`` all twelve. Token splits, traces, the primitive set,
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
)
SLOT_INPUT_NAMES = ("slot_tv", "slot_kl_pq", "slot_kl_qp")
ALL_INPUTS = INPUTS + TRACE_INPUTS
N_V2_INPUTS = len(ALL_INPUTS) - len(SLOT_INPUT_NAMES)    # the inputs of v2 traces: 9
INPUT_NAMES = tuple(i[0] for i in INPUTS)
ALL_INPUT_NAMES = tuple(i[0] for i in ALL_INPUTS)         # twelve, in opcode order
TRACE_INPUT_NAMES = ALL_INPUT_NAMES[:N_V2_INPUTS]         # the nine of a v2 trace signature
