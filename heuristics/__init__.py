"""Acceptance heuristics: reference baselines, the evolved champion, a registry.

Every heuristic is a plain scalar function with the reference signature
``h(draft_prob, target_prob, position, draft_entropy, target_entropy,
top_token_match) -> threshold``; a token is accepted iff ``rand_value <
threshold`` (a NaN threshold rejects).
"""
