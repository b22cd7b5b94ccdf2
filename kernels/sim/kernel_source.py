"""Reading a kernel for the compiled tier: its def as an AST, what its free names stand for, which calls need barriers.

The first half of ``translate.py``'s work (kernel source -> ``translate.py`` ->
``fission.py`` -> ``writer.py`` -> ``compiled.py``): before rewriting a kernel or a
device function, the translator reads its source (``parse_def``, with the file's line
numbers, which every error and every region's name quote), the values its free names
are bound to (``free_values``: closure cells, then globals), the ``cuda.*`` paths it
uses (``cuda_path``), and whether a device function it calls holds a barrier or shared
memory (``needs_inline``: then it runs as a unit of the kernel, not as a function of
its own).  The values a kernel may read become source text here too: numbers and
tuples (``constant_source``), numba types (``numba_type_source``).
"""

from __future__ import annotations

import ast
import builtins
import inspect
import math
import textwrap

import numba
import numpy as np
from numba.core import types as nbtypes

from pyflow.kernels.backend import cuda as _cuda

from .translation import Unsupported

__all__ = ["dtype_of", "numba_type_source", "constant_source", "is_device_function", "python_function",
           "is_group_barrier", "location", "parse_def", "local_names", "free_values", "cuda_path", "needs_inline"]


def dtype_of(value) -> np.dtype:
    """A numpy dtype from what kernels pass to cuda.*.array: numba types, numpy dtypes, type names."""
    if isinstance(value, nbtypes.Type):
        return np.dtype(numba.np.numpy_support.as_dtype(value))
    return np.dtype(value)


def numba_type_source(ty) -> str:
    """Python source that evaluates to the numba type ``ty`` (``Unsupported`` if there is none)."""
    if isinstance(ty, nbtypes.Boolean):
        return "numba.types.boolean"
    if isinstance(ty, (nbtypes.Integer, nbtypes.Float, nbtypes.Complex)):
        return f"numba.types.{ty.name}"
    if isinstance(ty, nbtypes.Array):
        return (f"numba.types.Array({numba_type_source(ty.dtype)}, {ty.ndim}, {ty.layout!r}, "
                f"readonly={not ty.mutable})")
    if isinstance(ty, nbtypes.UniTuple):
        return f"numba.types.UniTuple({numba_type_source(ty.dtype)}, {ty.count})"
    if isinstance(ty, nbtypes.Tuple):
        return f"numba.types.Tuple(({''.join(numba_type_source(t) + ', ' for t in ty.types)}))"
    if isinstance(ty, nbtypes.NumberClass):
        return numba_type_source(ty.instance_type)
    raise Unsupported(f"no source for the numba type {ty}")


def constant_source(value) -> str | None:
    """Source text for a constant a kernel may read from its module or closure; None if it is not one.

    >>> constant_source((16, 0.5, float("-inf"), np.float32(2))), constant_source([1])
    ('(16, 0.5, -np.inf, np.float32(2.0), )', None)
    """
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, int):
        return repr(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "np.nan"
        return repr(value) if math.isfinite(value) else ("np.inf" if value > 0 else "-np.inf")
    if isinstance(value, np.generic) and value.dtype.kind in "biuf":
        inner = constant_source(value.item())
        name = "bool_" if value.dtype.kind == "b" else value.dtype.name
        return None if inner is None else f"np.{name}({inner})"
    if isinstance(value, tuple):
        parts = [constant_source(v) for v in value]
        return None if None in parts else "(" + "".join(p + ", " for p in parts) + ")"
    if isinstance(value, nbtypes.Type):
        try:
            return numba_type_source(value)
        except Unsupported:
            return None
    if isinstance(value, np.dtype):
        return f"np.dtype({value.str!r})"
    return None


def is_device_function(value) -> bool:
    """Is ``value`` a ``cuda.jit(device=True)`` function (the simulator's, or numba's stock simulator's)?"""
    from numba.cuda.simulator.kernel import FakeCUDAKernel

    from .kernel import SimDeviceFunction

    return isinstance(value, SimDeviceFunction) or (isinstance(value, FakeCUDAKernel) and value._device)


def python_function(device_function):
    """The plain Python function a device function wraps, whose source the translator reads."""
    return getattr(device_function, "py_func", None) or device_function.fn


def is_group_barrier(value) -> bool:
    """Is device function ``value`` Cocktailer's ``group_barrier`` (a barrier marker, not a call)?"""
    fn = python_function(value)
    return fn.__name__ == "group_barrier" and fn.__module__ == "pyflow.kernels.utask.groups"


def location(fn, node) -> str:
    """"file:line" of ``node`` in ``fn``'s file: how errors and the generated code's comments name a place."""
    line = getattr(node, "lineno", None)
    return f"{fn.__code__.co_filename}:{line}" if line else fn.__code__.co_filename


def parse_def(fn) -> ast.FunctionDef:
    """The function's def as an AST whose line numbers are the file's."""
    try:
        source = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError) as error:
        raise Unsupported(f"the source of {fn.__qualname__} cannot be read ({error})") from None
    tree = ast.parse(source)
    ast.increment_lineno(tree, fn.__code__.co_firstlineno - 1)
    node = tree.body[0]
    if not isinstance(node, ast.FunctionDef):
        raise Unsupported(f"{fn.__qualname__} is not a plain def")
    node.decorator_list = []
    return node


def local_names(node: ast.FunctionDef) -> set:
    """The function's parameters and the names it assigns: these are its own, not its module's."""
    names = {a.arg for a in node.args.args}
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name) and isinstance(sub.ctx, (ast.Store, ast.Del)):
            names.add(sub.id)
    return names


def free_values(fn) -> dict:
    """Closure cells and globals of ``fn``, by name (closure first, as Python looks them up)."""
    values = dict(fn.__globals__)
    for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
        try:
            values[name] = cell.cell_contents
        except ValueError:
            pass
    return values


def cuda_path(node, resolve) -> list | None:
    """['threadIdx', 'x'] for ``cuda.threadIdx.x`` (the root a name bound to the cuda module)."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name) and resolve(node.id) is _cuda:
        return parts[::-1]
    return None




def needs_inline(fn, facts: dict) -> bool:
    """Does ``fn`` (or a device function it calls) use barriers, shared memory or this_grid?

    ``facts`` remembers the answer per function for one kernel's translation (``fn`` -> bool).
    """
    found = facts.get(fn)
    if found is not None:
        return found
    facts[fn] = False         # a recursive call assumes not (checked when it is translated)
    tree, values = parse_def(fn), free_values(fn)
    locals_ = local_names(tree)

    def resolve(name):
        return None if name in locals_ else values.get(name, getattr(builtins, name, None))

    result = False
    for sub in ast.walk(tree):
        path = cuda_path(sub, resolve) if isinstance(sub, ast.Attribute) else None
        if path and path[0] in ("syncthreads", "shared", "cg", "syncthreads_count", "syncthreads_and",
                                "syncthreads_or"):
            result = True
        if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Load):
            value = resolve(sub.id)
            if value is not None and is_device_function(value) and (
                    is_group_barrier(value) or needs_inline(python_function(value), facts)):
                result = True
    facts[fn] = result
    return result
