"""A champion's standing on valid: the three verdicts ``champion.json`` records
(the ``verdict`` of its ``standing``). Each data world's report sets one
(``evolve.tasks``), write-back keeps only a winner unforced
(``evolve.tasks.writeback``), ``evolve export`` refuses an infeasible one unless told
otherwise, and ``evolve.runs.schema`` checks a champion read back against the same
words; ``sentence`` is how every command says it."""

VERDICTS = WINS, LOSES, INFEASIBLE = ("wins", "loses", "infeasible")

# how each verdict reads after "the champion", and what it means in a few words
VERB = {WINS: "wins", LOSES: "loses", INFEASIBLE: "is infeasible"}
MEANING = {WINS: "the best rule on valid",
           LOSES: "another rule does better on valid",
           INFEASIBLE: "over the run's budget, or below the standard rule, on valid"}


def sentence(verdict: str, why: str) -> str:
    """What follows "the champion": ``loses (another rule does better on valid): why``."""
    return f"{VERB[verdict]} ({MEANING[verdict]}): {why}"
