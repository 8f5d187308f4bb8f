"""Free-running decoding with any rule, and comparisons of rules by it.

``simulate`` decodes free-running with one rule (``evolve simulate``); ``paired``
compares rules on the same prompts and uniforms (``evolve simulate --compare``,
``evolve.compare``); ``task_compare`` does the same on a task's problems, with task
accuracy (``evolve simulate-task``).
"""
