"""The types of what a kernel's threads keep across barriers, asked of numba by compiling the kernel without them.

Step 3 of the compiled tier (kernel source -> translate -> fission -> this -> writer ->
compiled), for kernels with barriers.  A variable that lives from one region to the
next is kept per thread in an array (``v_acc[cu_g]``, ``writer.py``), whose dtype the
writer must know.  The kernel's body is compiled once as a plain function with its
barriers removed (the "shadow"; each unit a function of its own, which a call marker
calls), and numba's type inference says what each such variable is
(``var_types``).  The answer is remembered in the cache directory
(``module_cache.py``), so a kernel typed before is not compiled twice.
"""

from __future__ import annotations

import ast
import hashlib
import os

import numba
import numpy as np
from numba.core import types as nbtypes

from .kernel_source import numba_type_source
from .module_cache import cache_dir, load_module
from .translation import BARRIERS, CONTEXT, Unsupported

__all__ = ["var_types"]


def var_types(tr, var, types, remembered_only: bool = False) -> dict | None:
    """numba's types of the variables kept per thread, from a compile of the body without barriers.

    The "shadow" module has a function per unit (``shadow_fK``) and one for the kernel; a call
    marker becomes a call of the unit's shadow, so numba types each unit once per argument types.
    ``remembered_only``: the types only if they were remembered before (None if not): no compile.
    """
    storage = []
    for s in tr.storage:
        dtype = numba.from_dtype(np.dtype("uint8") if s.kind == "dynamic" else s.dtype)
        storage.append((s.name, nbtypes.Array(dtype, 2 if s.kind == "dynamic" else len(s.shape) + 1, "C")))
    context = list(CONTEXT)
    tail = context + [n for n, _ in storage]
    units = {u.id: u for u in tr.units}
    lines = ["import math", "import numba", "import numpy as np", "from numba import njit",
             "from pyflow.kernels.sim import cpu_runtime as cu_rt",
             "JIT = njit(error_model='numpy')", ""]
    for helper in tr.helpers:
        lines += ["@JIT"] + ast.unparse(helper.tree).splitlines() + [""]
    for unit in tr.units:   # callees first
        body = _shadow_body(unit.body, units, tail)
        lines += ["@JIT", f"def shadow_f{unit.id}({', '.join(unit.params + tail)}):"]
        lines += ["    " + line for line in body] + ([f"    return f{unit.id}_ret"] if unit.returns else []) + [""]
    lines += ["@JIT", f"def shadow({', '.join(tr.params + tail)}):"]
    lines += ["    " + line for line in _shadow_body(tr.body, units, tail)]
    text = "\n".join(lines) + "\n"
    key = hashlib.sha1((text + repr(types) + repr(var.stored) + "carray").encode()).hexdigest()[:16]
    remembered = os.path.join(cache_dir(), f"pyflow_sim_{tr.name}_types_{key}.txt")
    if os.path.exists(remembered):   # typed before, on this machine: no need to compile the shadow
        with open(remembered) as f:
            found = dict(line.rstrip("\n").split("\t", 1) for line in f if "\t" in line)
        if set(found) == set(var.stored):
            return found
    if remembered_only:
        return None
    module = load_module(text, f"{tr.name}_types")
    sig = tuple(types) + (nbtypes.int64,) * len(context) + tuple(t for _, t in storage)
    module.shadow.compile(sig)
    typemaps = [module.shadow.overloads[sig].type_annotation.typemap]
    for unit in tr.units:
        typemaps += [o.type_annotation.typemap for o in getattr(module, f"shadow_f{unit.id}").overloads.values()]
    ctx = module.shadow.typingctx
    found = {}
    for v in var.stored:
        seen = [nbtypes.unliteral(t) for typemap in typemaps for k, t in typemap.items()
                if k == v or (k.startswith(v + ".") and k[len(v) + 1:].isdigit()) or k == "arg." + v]
        if not seen:
            seen = [nbtypes.float64]   # numba dropped it (dead code): any type will do
        unified = seen[0]
        for t in seen[1:]:
            unified = ctx.unify_pairs(unified, t)
            if unified is None:
                raise Unsupported(f"variable {v!r} has types {seen} that do not unify")
        found[v] = _storage_type(unified)
    tmp = f"{remembered}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write("".join(f"{v}\t{t}\n" for v, t in found.items()))
    os.replace(tmp, remembered)
    return found


def _storage_type(ty) -> str:
    """How a variable of numba type ``ty`` is kept per thread: a numpy dtype, or a numba type for a dict."""
    if isinstance(ty, nbtypes.Boolean):
        return "np.bool_"
    if isinstance(ty, (nbtypes.Integer, nbtypes.Float, nbtypes.Complex)):
        return f"np.{numba.np.numpy_support.as_dtype(ty).name}"
    if (isinstance(ty, nbtypes.Array) and ty.layout == "C" and ty.mutable
            and isinstance(ty.dtype, (nbtypes.Integer, nbtypes.Float, nbtypes.Boolean))):
        return f"carray:{numba.np.numpy_support.as_dtype(ty.dtype).name}:{ty.ndim}"   # cpu_runtime.keep_array
    return numba_type_source(ty)


def _shadow_body(body: list, units: dict, tail: list) -> list:
    """Source lines of ``body`` for typing: barriers made ``pass``, a unit's call marker a call of its shadow."""

    class Strip(ast.NodeTransformer):
        def visit_Expr(self, node):
            call = node.value
            if isinstance(call, ast.Call) and isinstance(call.func, ast.Name):
                if call.func.id == "cu_call":
                    unit = units[call.args[0].value]
                    text = f"shadow_f{unit.id}({', '.join(unit.params + tail)})"
                    return ast.parse(f"f{unit.id}_ret = {text}" if unit.returns else text).body[0]
                if call.func.id in BARRIERS:
                    return ast.Pass()
            return node

    module = ast.Module(body=[ast.parse(ast.unparse(s)).body[0] for s in body], type_ignores=[])
    return ast.unparse(Strip().visit(module)).splitlines() or ["pass"]
