"""The task world's data: problems with checked answers.

- ``files``: task files (JSON lines: prompt, answer, optional split) and ``Problem``;
- ``checker``: the final answer of a text (after a delimiter, or a regex group)
  compared exactly or as a number with the reference.
"""
