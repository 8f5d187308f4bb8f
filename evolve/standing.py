"""A champion's standing on valid: the three verdicts ``champion.json`` records
(the ``verdict`` of its ``standing``). Each data world's report sets one
(``evolve.tasks``), write-back keeps only a winner unforced
(``evolve.tasks.writeback``), ``evolve export`` refuses an infeasible one unless told
otherwise, and ``evolve.runs.schema`` checks a champion read back against the same
words."""

VERDICTS = WINS, LOSES, INFEASIBLE = ("wins", "loses", "infeasible")
