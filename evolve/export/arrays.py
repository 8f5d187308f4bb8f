"""The array part of every exported module: ``threshold(...)``.

``threshold`` evaluates the rule element-wise over arrays (numpy) or tensors
(torch) of any shape, broadcast together, in the inputs' floating dtype
(float32 or float64; float64 when no floating array is given) and, for torch,
on the inputs' device; ``accept`` and the scope the rule was scored with follow
(``evolve.export.scope``). The code
is straight-line, one assignment per node of the tree, written from the
backend tables of ``evolve.export.backends``.
"""

from __future__ import annotations

from heuristics import ops
from evolve.export.backends import Backend, helpers_used, statements
from evolve.lang import primitives as P

CONSTANTS = (("DIV_EPS", ops.DIV_EPS), ("LOG_EPS", ops.LOG_EPS), ("LOG_FLOOR", ops.LOG_FLOOR),
             ("EXP_MAX", ops.EXP_MAX), ("EXP_CAP", ops.EXP_CAP))

_NUMPY_PROLOGUE = '''\
    args = [np.asarray(x) for x in ({args},)]
    floats = [x.dtype for x, f in zip(args, IS_FLOAT) if f and np.issubdtype(x.dtype, np.floating)]
    dtype = np.dtype(np.result_type(*floats)) if floats else np.dtype(np.float64)
    shape = np.broadcast_shapes(*(x.shape for x in args))
    {args}, = [x.astype(dtype, copy=False) if f else x.astype(bool, copy=False)
               for x, f in zip(args, IS_FLOAT)]
    K = dtype.type
    with np.errstate(all="ignore"):
'''

_NUMPY_EPILOGUE = '''\
    return np.broadcast_to(np.asarray({result}, dtype=dtype), shape).copy()
'''

_TORCH_PROLOGUE = '''\
    given = [x for x in ({args},) if torch.is_tensor(x)]
    device = given[0].device if given else torch.device("cpu")
    floats = [x.dtype for x, f in zip(({args},), IS_FLOAT)
              if f and torch.is_tensor(x) and x.is_floating_point()]
    dtype = floats[0] if floats else torch.float64
    for d in floats[1:]:
        dtype = torch.promote_types(dtype, d)
    args = [torch.as_tensor(x, device=device) for x in ({args},)]
    shape = torch.broadcast_shapes(*(x.shape for x in args))
    {args}, = [x.to(dtype) if f else x.to(torch.bool) for x, f in zip(args, IS_FLOAT)]

    def K(value):
        return torch.tensor(value, dtype=dtype, device=device)

'''

_TORCH_EPILOGUE = '''\
    return torch.broadcast_to(torch.as_tensor({result}, dtype=dtype, device=device),
                              shape).clone()
'''


def constants_source() -> str:
    return "".join(f"{name} = {value!r}\n" for name, value in CONSTANTS)


def threshold_source(nodes, backend: Backend, inputs: tuple) -> str:
    """``INPUTS``, ``IS_FLOAT``, the helpers and ``threshold(<inputs>)`` (``accept`` and
    the scope follow: ``evolve.export.scope``)."""
    args = ", ".join(inputs)
    is_float = ", ".join("True" if P.INPUT_TYPE[n] is float else "False" for n in inputs)
    lines, result = statements(nodes, backend)
    if backend.name == "numpy":
        body = _NUMPY_PROLOGUE.format(args=args)
        body += "".join(f"        {line}\n" for line in lines) or "        pass\n"
        body += _NUMPY_EPILOGUE.format(result=result)
    else:
        body = _TORCH_PROLOGUE.format(args=args)
        body += "".join(f"    {line}\n" for line in lines)
        body += _TORCH_EPILOGUE.format(result=result)
    helpers = "\n\n".join(helpers_used(nodes, backend))
    kind = "arrays" if backend.name == "numpy" else "tensors"
    return (f"INPUTS = {tuple(inputs)!r}\n"
            f"IS_FLOAT = ({is_float},)\n\n\n"
            + (f"{helpers}\n\n" if helpers else "")
            + f"def threshold({args}):\n"
            f'    """The acceptance threshold of every element ({kind} of any shape, '
            f'broadcast\n    together); a drafted token is accepted iff u < threshold."""\n'
            f"{body}\n")
