"""An acceptance rule as an object: what a run's champion is in Python.

    import evolve
    rule = evolve.load_run("runs/my-run").rule      # or evolve.Rule("pmin(1.0, ...)")
    print(rule)                                     # min(1, (t / d)), the formula
    rule.threshold({"draft_prob": q, "target_prob": p, ...})   # numpy arrays, any shape
    rule.acceptance(features, draft_rank=ranks)     # the probability it was scored with
    rule.sympy(), rule.latex()                      # the formula in sympy, in LaTeX
    rule.numpy(), rule.torch()                      # the exports' interface
    rule.source("hf")                               # what `evolve export --format hf` writes
    rule.metrics["test"], rule.scope

A ``Rule`` holds a parsed tree (``evolve.lang.treeio``; its text is never evaluated),
the ``scope`` it was scored with on traces (``evolve.data.traces.scope_of``: the
draft's top-k, the draft length and temperature; None for a rule scored on token
splits) and its ``metrics`` per split. ``acceptance`` decides as the exports do
(``evolve.export.scope``): the rule inside its scope, clip(threshold, 0, 1) with NaN as
0; the standard rule min(1, target_prob / draft_prob) for drafts ranked at or beyond
``top_k``; a rule of a top-k scope refuses a call without the ranks. Every array given
to ``threshold``, ``acceptance``, ``accept`` and ``draft_rank`` is checked against its
input's domain first (``evolve.api.rule_inputs``): one RuleInputError line naming it. ``numpy()`` and
``torch()`` give the interface of the modules ``evolve export --format numpy|torch``
writes, evaluated in this process by the project's own evaluators (no generated text
is run); ``source(format)`` is the text an export writes, and tests hold the two to
the same decisions.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from evolve.api import rule_inputs as RI
from evolve.api.rule_inputs import RuleInputError
from evolve.errors import show
from evolve.lang import codegen, numpy_eval, treeio
from evolve.lang import primitives as P
from evolve.objectives import SETTING_KEYS


class Rule:
    """An acceptance rule: a parsed tree, the scope it was scored with and its metrics.

    ``Rule(tree)`` takes the tree's text (``pmin(1.0, pdiv(target_prob, draft_prob))``)
    or parsed nodes; ``Rule.from_run(path)``, ``Rule.installed()`` and
    ``Rule.named(name, param)`` read one from a run directory, the installed
    heuristics or the rules table. ``str(rule)`` is its formula."""

    def __init__(self, tree, *, scope: dict | None = None, metrics: dict | None = None,
                 name: str | None = None, meta: dict | None = None):
        if isinstance(tree, str):
            nodes = treeio.parse(tree)
        elif isinstance(tree, (list, tuple)) and tree and all(
                isinstance(n, treeio.Node) for n in tree):
            nodes = list(tree)
        else:
            raise RuleInputError.of("tree", f"{show(tree)} is invalid; expected a tree's "
                                            "text or its parsed nodes")
        if scope is not None:
            from evolve.runs.schema import check_scope    # lazy: only a scoped rule reads it
            check_scope(scope, "scope")
        self.nodes = nodes
        self.tree = treeio.to_string(nodes)
        self.scope = scope
        self.metrics = dict(metrics or {})
        self.name = name or self.expression
        self._meta = dict(meta or {})

    # ----------------------------------------------------------- constructors
    @classmethod
    def from_champion(cls, champion: dict, name: str | None = None) -> "Rule":
        """The rule of a ``champion.json`` record (its tree, scope and metrics)."""
        return cls(champion["tree"], scope=champion.get("scope"),
                   metrics=champion.get("metrics"), name=name,
                   meta={k: champion[k] for k in ("objective", *SETTING_KEYS, "generation",
                                                   "standing") if k in champion})

    @classmethod
    def from_run(cls, path, runs_dir=None) -> "Rule":
        """The champion of a run directory (a path, or a name under ``runs_dir``), with
        the scope its exports keep (a trace champion without one is a RunError)."""
        from evolve.export import champions    # lazy: the export layer loads on use
        from evolve.io import paths    # lazy: as above
        from evolve.runs.rundir import RunDir    # lazy: as above
        rd = RunDir.open(paths.runs_dir(runs_dir), str(getattr(path, "path", path)))
        nodes, meta, _ = champions.from_run(rd.path.parent, str(rd.path))
        champ = rd.champion()
        return cls(nodes, scope=meta.get("scope"), metrics=champ.get("metrics"),
                   name=f"run {rd.name}", meta=meta)

    @classmethod
    def installed(cls, kind: str = "trace", directory=None) -> "Rule":
        """The installed rule: ``heuristics/evolved_trace.py`` (``trace``) or
        ``heuristics/evolved.py`` (``tokens``), read from its METADATA (never imported)."""
        from evolve.export import champions    # lazy: the export layer loads on use
        if kind not in champions.INSTALLED:
            raise RuleInputError.of("kind", f"{show(kind)} is invalid; expected trace or "
                                            "tokens")
        nodes, meta, _ = champions.from_installed(kind, directory)
        return cls(nodes, scope=meta.get("scope"), metrics=meta.get("metrics"),
                   name=f"installed {kind} rule", meta=meta)

    @classmethod
    def named(cls, name: str, param: float | None = None) -> "Rule":
        """A rule of the rules table (``evolve.rules.table``) at ``param`` (default: the
        family's own); RuleError for an unknown name or a parameter out of range."""
        from evolve.rules.adapters import named_rule    # lazy: the rules table on use
        tree_rule, info = named_rule(name, param)
        return cls(tree_rule.nodes, name=info["label"])

    # ------------------------------------------------------------- reading
    @property
    def expression(self) -> str:
        """The formula in infix form (inputs by their short names)."""
        return codegen.infix(self.nodes)

    @property
    def inputs(self) -> tuple:
        """The inputs the rule reads, in the table's order."""
        read = {n.name for n in self.nodes if n.kind == "input"}
        return tuple(n for n in P.INPUT_INDEX if n in read)

    def __str__(self) -> str:
        return self.expression

    def __repr__(self) -> str:
        sc = self.scope
        where = ("" if sc is None else
                 ", scope=greedy" if sc.get("decoding") == "greedy" else
                 f", scope=top-{sc['top_k']}" if sc.get("top_k") is not None else
                 ", scope=every token")
        return f"Rule({self.expression!r}{where})"

    def __eq__(self, other) -> bool:
        return isinstance(other, Rule) and (self.tree, self.scope) == (other.tree, other.scope)

    @property
    def greedy(self) -> bool:
        """Whether the rule was scored in greedy decoding (its scope says so)."""
        return (self.scope or {}).get("decoding") == "greedy"

    @property
    def scored_on_tokens(self) -> bool:
        """Whether the rule is the champion of a run on token splits (the seed's world:
        scored with no decoding at all, so no trace or task is its scope)."""
        objective = self._meta.get("objective")
        if objective is None:
            return False
        from evolve.tasks import champion_task    # lazy: the objectives' table on use
        return not champion_task({"objective": objective}).trace_inputs

    def __hash__(self) -> int:
        return hash(self.tree)

    def sympy(self):
        """The formula as a sympy expression (protected operators read as plain ones;
        ``evolve.lang.symbolic``)."""
        from evolve.lang.symbolic import sympy_expr    # lazy: SymPy loads on use
        return sympy_expr(self.nodes)

    def latex(self) -> str:
        """The formula in LaTeX (sympy's ``latex``), inputs by their short names. The
        protected operators are named functions, ``\\operatorname{pdiv}{\\left(t,d
        \\right)}``, never their plain counterparts: ``pdiv(a, b)`` is 1 where |b| <=
        1e-9, ``plog`` and ``pexp`` are bounded (heuristics/ops.py), so no simplification
        may treat them as ``/``, ``log`` and ``exp``."""
        import sympy    # lazy: SymPy loads on use
        from evolve.lang.symbolic import sympy_expr    # lazy: as above
        return sympy.latex(sympy_expr(self.nodes, protected=True))

    # ------------------------------------------------------------ evaluating
    def _columns(self, features, extra: dict) -> tuple[dict, tuple]:
        """The inputs the rule reads (and its scope needs), each checked against its
        domain (``evolve.api.rule_inputs``), and the shape they broadcast to."""
        if features is None:
            features = {}
        elif not (isinstance(features, Mapping) or hasattr(features, "__getitem__")):
            raise RuleInputError.of("features", f"{show(features)} is invalid; expected a "
                                                "mapping of input names to arrays")
        for name in extra:
            if name not in P.INPUT_INDEX:
                raise RuleInputError.of(name, f"not an input of a rule (inputs: "
                                              f"{', '.join(P.INPUT_INDEX)})")
        need = set(self.inputs)
        if self.greedy:                         # the argmax drafts are kept
            need.add("top_token_match")
        elif self.scope:                        # the standard rule outside the scope
            need |= {"draft_prob", "target_prob"}
        cols = {}
        for name in (n for n in P.INPUT_INDEX if n in need):      # the table's order
            if name in extra:
                value = extra[name]
            else:
                try:
                    value = features[name]
                except (KeyError, IndexError, ValueError, TypeError):
                    raise RuleInputError.of("features", f"{name!r} is missing; the rule reads "
                                            f"{', '.join(self.inputs)}") from None
            cols[name] = RI.check_input(name, value)
        return cols, RI.check_shapes(cols)

    def threshold(self, features=None, **columns) -> np.ndarray:
        """The threshold of every element: a drafted token is accepted iff u < threshold
        (inside its scope). ``features``: a mapping of input names to arrays (a dict, a
        pandas DataFrame, a numpy record array), or the arrays as keywords; any shape,
        broadcast together; float64. Each array is checked against its input's domain
        (``evolve.lang.features.DOMAINS``: probabilities in [0, 1], positions whole, ...):
        anything else is one RuleInputError naming it."""
        cols, _ = self._columns(features, columns)
        return numpy_eval.evaluate(self.nodes, cols)

    def acceptance(self, features=None, draft_rank=None, **columns) -> np.ndarray:
        """The acceptance probability the rule was scored with: clip(threshold, 0, 1)
        (NaN: 0) inside its scope, min(1, target_prob / draft_prob) for drafts ranked
        ``top_k`` or later (``draft_rank``, e.g. from ``draft_rank(q, token)``); a rule of
        a top-k scope needs ``draft_rank``. A rule scored in greedy decoding (a task
        champion's scope) keeps a draft that is the target's argmax (1) and gives every
        other clip(threshold, 0, 1). ``draft_rank``, when given, is checked as the
        features are (whole numbers >= 0, broadcasting with them)."""
        from evolve.export.scope import numpy_scoped    # lazy: the export layer on use
        cols, shape = self._columns(features, columns)
        if draft_rank is not None:
            draft_rank = RI.check("draft_rank", draft_rank, "whole")
            RI.check_against("draft_rank", draft_rank, shape)
        h = numpy_eval.evaluate(self.nodes, cols)
        k = None if self.scope is None else self.scope.get("top_k")
        if k is not None and not self.greedy and draft_rank is None:
            raise RuleInputError.of("draft_rank", f"needed: the rule was scored on drafts "
                                    f"among the draft's top {k} (the standard rule decides "
                                    "the others); see Rule.draft_rank")
        return numpy_scoped(h, draft_rank, cols.get("top_token_match"), cols.get("draft_prob"),
                            cols.get("target_prob"), k, self.greedy)

    def accept(self, u, features=None, draft_rank=None, **columns) -> np.ndarray:
        """True where a drafted token with uniform ``u`` (in [0, 1], broadcasting with
        the features) is accepted: u < acceptance."""
        u = RI.check("u", u, "unit")
        a = self.acceptance(features, draft_rank, **columns)
        RI.check_against("u", u, a.shape)
        return u < a

    @staticmethod
    def draft_rank(q, token) -> np.ndarray:
        """The rank of each drafted token under the draft's distribution ``q`` ([...,
        vocab]; 0 the most probable, ties: lower id first), as traces take candidates.
        ``token``: token ids 0..vocab - 1, broadcasting with q's rows; anything else (and
        a q that is not probabilities) is one RuleInputError naming the argument."""
        from evolve.export.scope import numpy_draft_rank    # lazy: the export layer on use
        q, token = RI.check_ranking(q, token)
        return numpy_draft_rank(q, token)

    # -------------------------------------------------------------- exports
    def export_metadata(self) -> dict:
        """What an export's header and METADATA say of this rule (its scope included)."""
        meta = {"tree": self.tree, **self._meta, "scope": self.scope}
        meta.setdefault("metrics", {})
        return meta

    def source(self, format: str = "numpy") -> str:
        """The text ``evolve export --format FORMAT`` writes for this rule (numpy, torch,
        hf, vllm or vllm-patch); ExportError when the format cannot compute its inputs."""
        from evolve.export.modules import FORMATS, export_source    # lazy: export on use
        from evolve.export.vllm_patch import patch_source    # lazy: as above
        meta = self.export_metadata()
        title = f"Acceptance rule {codegen.sanitise(self.name, 80)}"
        if format not in FORMATS:
            from evolve.export.modules import check_format    # lazy: as above
            check_format(format, self.nodes)
            return patch_source(self.nodes, meta, title)
        return export_source(self.nodes, format, meta, title)

    def numpy(self) -> "RuleFunctions":
        """The rule with the interface of its numpy export (``INPUTS``, ``SCOPE``,
        ``threshold(*inputs)``, ``acceptance(draft_rank, *inputs)``, ``accept(u, *inputs,
        draft_rank=...)``, ``draft_rank``), evaluated here by the numpy reference
        (``evolve.lang.numpy_eval``), in float64."""
        return RuleFunctions(self, "numpy")

    def torch(self) -> "RuleFunctions":
        """The same interface over torch tensors on their device (needs torch), evaluated
        by the project's torch interpreter (``evolve.kernels.gpu.interp``: the Numba
        kernels' thresholds bit for bit), in float64."""
        return RuleFunctions(self, "torch")

    def to_dict(self) -> dict:
        """tree, expression, inputs, scope and metrics as plain data."""
        return {"name": self.name, "tree": self.tree, "expression": self.expression,
                "inputs": list(self.inputs), "scope": self.scope, "metrics": self.metrics}


class RuleFunctions:
    """A rule with the interface of its exported module (``evolve.export.scope``), over
    numpy arrays or torch tensors: ``INPUTS`` (the positional inputs, as the export's
    signature), ``SCOPE``, ``TOP_K``, ``BLOCK_SIZE``, ``TEMPERATURE``, ``threshold``,
    ``acceptance``, ``accept`` and ``draft_rank``."""

    def __init__(self, rule: Rule, lib: str):
        from evolve.export import scope    # lazy: the export layer on use
        self._scope = scope
        self.rule, self.lib = rule, lib
        self.INPUTS = P.signature_of(rule.nodes, codegen.uses_trace_inputs(rule.nodes))
        sc = rule.scope or {}
        self.SCOPE, self.TOP_K = rule.scope, sc.get("top_k")
        self.BLOCK_SIZE, self.TEMPERATURE = sc.get("block_size"), sc.get("temperature")
        if lib == "torch":
            import torch    # lazy: only the torch form needs it (the gpu extra)
            from evolve.kernels.gpu import interp    # lazy: as above
            self._torch, self._interp = torch, interp
            (self._ops, self._consts), = interp.program_lists(treeio.linearise([rule.nodes]))

    def __repr__(self) -> str:
        return f"<{self.lib} functions of {self.rule!r}>"

    def threshold(self, *inputs):
        """The threshold of every element (inputs in ``INPUTS`` order, broadcast)."""
        if len(inputs) != len(self.INPUTS):
            raise RuleInputError.of("inputs", f"{len(inputs)} given; expected "
                                              f"{', '.join(self.INPUTS)}")
        if self.lib == "numpy":
            return self.rule.threshold(dict(zip(self.INPUTS, inputs)))
        torch = self._torch
        given = [x for x in inputs if torch.is_tensor(x)]
        device = given[0].device if given else torch.device("cpu")
        ts = [torch.as_tensor(x, device=device) for x in inputs]
        shape = torch.broadcast_shapes(*(t.shape for t in ts))
        n = 1
        for d in shape:
            n *= d
        X = torch.zeros((len(P.INPUT_INDEX), n), dtype=torch.float64, device=device)
        for name, t in zip(self.INPUTS, ts):
            X[P.INPUT_INDEX[name]] = t.broadcast_to(shape).reshape(-1).to(torch.float64)
        return self._interp.run(self._ops, self._consts, X).reshape(shape)

    def acceptance(self, draft_rank, *inputs):
        """The acceptance probability the rule was scored with (see ``Rule.acceptance``)."""
        if self.lib == "numpy":
            return self.rule.acceptance(dict(zip(self.INPUTS, inputs)), draft_rank)
        f = dict(zip(self.INPUTS, inputs))
        return self._scope.torch_scoped(self.threshold(*inputs), draft_rank, f["top_token_match"],
                                  f["draft_prob"], f["target_prob"], self.TOP_K,
                                  self.rule.greedy)

    def accept(self, u, *inputs, draft_rank=None):
        """True where the drafted token is accepted: u < acceptance (``draft_rank`` needed
        for a rule of a top-k scope)."""
        if self.TOP_K is not None and draft_rank is None:
            raise RuleInputError.of("draft_rank", f"needed: the rule was scored on drafts "
                                    f"among the draft's top {self.TOP_K}")
        if self.lib == "numpy":
            return self.rule.accept(u, dict(zip(self.INPUTS, inputs)), draft_rank)
        a = self.acceptance(0 if draft_rank is None else draft_rank, *inputs)
        return self._torch.as_tensor(u, device=a.device) < a

    def draft_rank(self, q, token):
        """The rank of each drafted token under ``q`` (see ``Rule.draft_rank``)."""
        sc = self._scope
        return (sc.numpy_draft_rank if self.lib == "numpy" else sc.torch_draft_rank)(q, token)
