"""The task world's data: problems with checked answers, and a draft/target pair.

- ``files``: task files (JSON lines: prompt, answer, optional split) and ``Problem``;
- ``checker``: the final answer of a text (after a delimiter, or a regex group)
  compared exactly or as a number with the reference;
- ``story``, ``grammar``, ``arithmetic``: the built-in synthetic task, arithmetic
  word problems with worked steps in varied wording and a ``#### <answer>`` line;
- ``target``, ``pair``: the grammar-exact target, the n-gram draft trained on its
  samples, and the pair ``evolve.data.decode.decode`` decodes with;
- ``greedy``: greedy decoding with one model, and task accuracy (evaluation only).
"""
