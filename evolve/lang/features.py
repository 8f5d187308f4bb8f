"""The one table of inputs a rule reads, in signature order.

(name in trees and code, short name in infix text, type). The kernel's opcode
of an input is its index here. The first six are the original record's
features and the reference signature of every heuristic; the last three exist
on speculative-decoding traces (schema v2): the position inside the draft
block (0-based), and the target's and the draft's top probability. Token
splits, traces, the primitive set, generated code and reports all read this
table (it imports nothing, so data modules can use it without loading Numba).
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
)
ALL_INPUTS = INPUTS + TRACE_INPUTS
INPUT_NAMES = tuple(i[0] for i in INPUTS)
TRACE_INPUT_NAMES = tuple(i[0] for i in ALL_INPUTS)
