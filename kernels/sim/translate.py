"""The compiled tier's front end: a kernel's Python source, with ``cuda`` made into plain values.

A CUDA-on-CPU compiler (MCUDA, POCL, CuPBoP) starts by reading the kernel and
replacing what only a GPU has.  ``translate(kernel.py_func)`` does that to the
kernel and every device function it reaches, on their ASTs:

* ``cuda.threadIdx.x`` ... ``cuda.gridDim.z`` become the names ``cu_tx`` ...
  ``cu_gdz`` (the generated loops set them), ``cuda.grid(n)`` / ``cuda.gridsize(n)``
  the arithmetic on them;
* ``cuda.shared.array(shape, dtype)`` becomes ``cu_rt.fixed_shape(cu_shK[cu_sb], shape)``: the block's
  slice of an array allocated once per launch (one per site, as on a GPU), its shape as constants;
  ``cuda.local.array`` becomes ``cu_loK[cu_g]``, the thread's slice;
* ``cuda.atomic.add(a, i, v)`` becomes ``cu_rt.atomic_add(a, i, v)`` (``cpu_runtime.py``,
  imported as ``cu_rt``: ``cu_`` names are the tier's own, which no kernel variable can hide);
* barriers become marker statements that ``fission.py`` splits the body at:
  ``cu_syncthreads()``, ``cu_grid_sync()`` (``this_grid().sync()``) and
  ``cu_group_barrier(state, slot, members)`` (``kernels/utask/groups.py``);
* names the function reads from its module or closure become what they stand
  for: numbers and tuples are written into the code (``TILE`` -> ``16``), numba
  types by their names, device functions by the name of their translation.
  Device functions with barriers or shared memory become *units*, translated once
  (their names prefixed ``fK_``) and run where a ``cu_call(K)`` marker stands; the
  others become ``njit`` functions of their own, with the thread's coordinates as
  extra arguments if they read them.

It reads each function with ``kernel_source.py`` (its AST, what its free names stand
for, which device functions hold barriers) and hands a ``Translation``
(``translation.py``) to ``fission.py``: kernel source -> translate -> fission ->
writer -> compiled.

Whatever this cannot take raises ``Unsupported`` naming the construct and its
line; the launch then runs on the threaded tier, and ``explain`` says why.
"""

from __future__ import annotations

import ast
import builtins
import inspect
import math

import numba
import numpy as np
from numba.core import types as nbtypes

from pyflow.kernels.backend import cuda as _cuda

from .kernel_source import (constant_source, cuda_path, dtype_of, free_values, is_device_function, is_group_barrier,
                            local_names, location, needs_inline, numba_type_source, parse_def, python_function)
from .translation import BARRIERS, CONTEXT, Helper, Storage, Translation, Unit, Unsupported

__all__ = ["translate"]

_DIM3 = {"threadIdx": "cu_t", "blockIdx": "cu_b", "blockDim": "cu_bd", "gridDim": "cu_gd"}
_ATOMICS = {"add", "sub", "and_", "or_", "xor", "inc", "dec", "exch", "max", "min", "nanmax", "nanmin",
            "cas", "compare_and_swap"}
_FENCES = {"threadfence", "threadfence_block", "threadfence_system"}
_BUILTINS = {"range", "len", "min", "max", "abs", "int", "float", "bool", "round", "print", "True", "False",
             "None", "divmod", "pow", "complex", "tuple", "slice", "IndexError", "ValueError", "ZeroDivisionError",
             "AssertionError", "RuntimeError"}
_MODULES = {id(math): "math", id(np): "np", id(numba): "numba"}


def _expr(text: str) -> ast.expr:
    return ast.parse(text, mode="eval").body


def _call(name: str, args) -> ast.Call:
    return ast.Call(ast.Name(name, ast.Load()), list(args), [])


class _Unit:
    """One kernel's translation in progress: helpers, storage, inline counter, facts per function."""

    def __init__(self):
        self.helpers: dict = {}        # py_func -> Helper
        self.helper_order: list = []
        self.storage: dict = {}        # (code, line, col) -> Storage
        self.units: dict = {}          # py_func -> Unit (device functions with barriers)
        self.unit_order: list = []
        self.facts: dict = {}          # py_func -> needs a unit (barriers, shared memory, this_grid)
        self.barriers: set = set()
        self.atomics = False
        self.fences = False

    def unit_for(self, fn, stmt, caller) -> "Unit":
        """The unit of device function ``fn`` (translated on its first call)."""
        found = self.units.get(fn)
        if found is not None:
            if found.body is None:
                raise caller.fail(f"recursion through {fn.__name__}(), which has barriers or shared memory", stmt)
            return found
        tree = parse_def(fn)
        if tree.args.vararg or tree.args.kwarg or tree.args.defaults or tree.args.kwonlyargs:
            raise Unsupported(f"device function {fn.__name__} with defaults, *args or keywords", location(fn, tree))
        k = len(self.units)
        unit = self.units[fn] = Unit(k, fn.__name__, location(fn, tree), [f"f{k}_{a.arg}" for a in tree.args.args])
        inner = _Rewriter(self, fn, tree, f"f{k}_", inline=True)
        body, result = tree.body, None
        if body and isinstance(body[-1], ast.Return):
            result, body = body[-1].value, body[:-1]
        statements = inner.block(body)
        if result is not None:
            ret = ast.copy_location(ast.Assign([ast.Name(f"f{k}_ret", ast.Store())], inner.visit(result)), tree.body[-1])
            ret.cu_where = location(fn, tree.body[-1])
            statements.append(ret)
        unit.body, unit.returns = statements or [ast.Pass()], result is not None
        self.unit_order.append(unit)
        return unit


def translate(kernel_fn) -> Translation:
    """Translate ``kernel_fn`` (a kernel's ``py_func``) and what it calls; ``Unsupported`` if it cannot."""
    unit = _Unit()
    tree = parse_def(kernel_fn)
    if tree.args.vararg or tree.args.kwarg or tree.args.kwonlyargs or tree.args.defaults:
        raise Unsupported("kernels with *args, **kwargs, keyword-only or default arguments",
                          location(kernel_fn, tree))
    rewriter = _Rewriter(unit, kernel_fn, tree, prefix="", inline=True)
    body = rewriter.block(tree.body)
    return Translation(kernel_fn.__name__, location(kernel_fn, tree), [a.arg for a in tree.args.args], body,
                       [unit.helpers[f] for f in unit.helper_order], list(unit.storage.values()),
                       set(unit.barriers), unit.atomics, list(unit.unit_order), fences=unit.fences)


class _Rewriter(ast.NodeTransformer):
    """Rewrites one function's body (the kernel's, an inlined one's, or a helper's)."""

    def __init__(self, unit: _Unit, fn, tree: ast.FunctionDef, prefix: str, inline: bool):
        self.unit, self.fn, self.tree, self.prefix, self.inline = unit, fn, tree, prefix, inline
        self.values = free_values(fn)
        self.locals = local_names(tree)
        for name in self.locals:
            if name.startswith("cu_"):
                raise Unsupported(f"the local name {name!r} (cu_ names are the compiled tier's own)",
                                  location(fn, tree))
        self.grid_aliases: set = set()   # locals bound to cuda.cg.this_grid()
        self.context: set = set()        # coordinates this function reads (helpers get them as arguments)

    # ---- names ------------------------------------------------------------------

    def resolve(self, name: str):
        if name in self.locals:
            return None
        if name in self.values:
            return self.values[name]
        return getattr(builtins, name, None)

    def fail(self, reason: str, node) -> Unsupported:
        return Unsupported(reason, location(self.fn, node))

    def visit_Name(self, node: ast.Name):
        if node.id in self.locals:
            if node.id in self.grid_aliases:
                raise self.fail(f"{node.id} (a grid group) used other than as {node.id}.sync()", node)
            return ast.copy_location(ast.Name(self.prefix + node.id, node.ctx), node)
        value = self.resolve(node.id)
        if node.id in _BUILTINS and value is getattr(builtins, node.id, object()):
            return node
        return ast.copy_location(self.value_expr(node.id, value, node), node)

    def value_expr(self, name: str, value, node) -> ast.expr:
        """What a free name (or attribute chain) stands for in the generated code."""
        if value is _cuda:
            raise self.fail("the cuda module used as a value", node)
        if id(value) in _MODULES:
            return ast.Name(_MODULES[id(value)], ast.Load())
        if is_device_function(value):
            if is_group_barrier(value) or needs_inline(python_function(value), self.unit.facts):
                raise self.fail(f"{name}() (it has barriers or shared memory) called inside an expression; "
                                "call it as a statement or as `x = f(...)`", node)
            return ast.Name(self.helper(python_function(value)).name, ast.Load())
        text = constant_source(value)
        if text is not None:
            return _expr(text)
        if name == "breakpoint":
            raise self.fail("breakpoint() (such kernels run threaded, so pdb can stop in them)", node)
        raise self.fail(f"{name!r} is a {type(value).__name__}, which compiled code cannot use", node)

    def visit_Attribute(self, node: ast.Attribute):
        path = cuda_path(node, self.resolve)
        if path is not None:
            return ast.copy_location(self.cuda_value(path, node), node)
        chain, base = [], node
        while isinstance(base, ast.Attribute):
            chain.append(base.attr)
            base = base.value
        if isinstance(base, ast.Name) and base.id not in self.locals:
            value = self.resolve(base.id)
            if id(value) not in _MODULES and value is not None and inspect.ismodule(value):
                for attr in reversed(chain):   # scalar_ops.add: look it up now
                    value = getattr(value, attr)
                return ast.copy_location(self.value_expr(".".join([base.id] + chain[::-1]), value, node), node)
        return self.generic_visit(node)

    # ---- cuda.* -----------------------------------------------------------------

    def coordinate(self, name: str) -> ast.Name:
        self.context.add(name)
        return ast.Name(name, ast.Load())

    def cuda_value(self, path: list, node) -> ast.expr:
        if len(path) == 2 and path[0] in _DIM3 and path[1] in "xyz":
            return self.coordinate(_DIM3[path[0]] + path[1])
        if path == ["warpsize"]:
            return ast.Constant(32)
        if path == ["laneid"]:
            return ast.BinOp(self.coordinate("cu_t"), ast.Mod(), ast.Constant(32))
        if len(path) == 1 and isinstance(getattr(_cuda, path[0], None), nbtypes.Type):
            return _expr(numba_type_source(getattr(_cuda, path[0])))
        raise self.fail(f"cuda.{'.'.join(path)}", node)

    def visit_Call(self, node: ast.Call):
        path = cuda_path(node.func, self.resolve)
        if path is None:
            if isinstance(node.func, ast.Name) and node.func.id == "breakpoint":
                raise self.fail("breakpoint() (such kernels run threaded, so pdb can stop in them)", node)
            if any(isinstance(a, ast.Starred) for a in node.args) or node.keywords and not self.is_builtin(node):
                raise self.fail("a call with *args or keywords", node)
            new = self.generic_visit(node)
            if isinstance(new.func, ast.Name) and new.func.id.startswith("cu_dev_"):
                helper = next(h for h in self.unit.helpers.values() if h.name == new.func.id)
                new.args += [self.coordinate(c) for c in helper.context]
            return new
        args = [self.visit(a) for a in node.args]
        name = ".".join(path)
        if path in (["grid"], ["gridsize"]):
            return self.grid_expr(path[0], node)
        if path in (["shared", "array"], ["local", "array"]):
            return self.storage(path[0], node)
        if path == ["const", "array_like"]:
            return args[0]
        if len(path) == 2 and path[0] == "atomic" and path[1] in _ATOMICS:
            self.unit.atomics = True
            func = ast.Attribute(ast.Name("cu_rt", ast.Load()), f"atomic_{path[1]}", ast.Load())
            return ast.copy_location(ast.Call(func, args, []), node)
        if path == ["cg", "this_grid"]:
            raise self.fail("cuda.cg.this_grid() other than `g = cuda.cg.this_grid()` or `...this_grid().sync()`",
                            node)
        if path in (["syncthreads"], ["cg", "this_grid", "sync"]) or path[0] in _FENCES:
            raise self.fail(f"cuda.{name}() inside an expression", node)
        if path[0] == "nanosleep":
            raise self.fail("cuda.nanosleep (a spin-wait: threads must run at once to make progress)", node)
        raise self.fail(f"cuda.{name}()", node)

    def is_builtin(self, node: ast.Call) -> bool:
        return isinstance(node.func, ast.Name) and node.func.id in ("print", "min", "max")

    def grid_expr(self, what: str, node: ast.Call) -> ast.expr:
        if len(node.args) != 1 or not isinstance(node.args[0], ast.Constant) or node.args[0].value not in (1, 2, 3):
            raise self.fail(f"cuda.{what}(n) needs a literal n of 1, 2 or 3", node)
        axes = "xyz"[:node.args[0].value]
        for axis in axes:
            for name in (("cu_b", "cu_bd", "cu_t") if what == "grid" else ("cu_gd", "cu_bd")):
                self.context.add(name + axis)
        if what == "grid":
            parts = [f"(cu_b{a} * cu_bd{a} + cu_t{a})" for a in axes]
        else:
            parts = [f"(cu_gd{a} * cu_bd{a})" for a in axes]
        return _expr(parts[0] if len(parts) == 1 else "(" + ", ".join(parts) + ")")

    def storage(self, kind: str, node: ast.Call) -> ast.expr:
        """``cuda.shared.array`` / ``cuda.local.array``: a slice of an array the launch allocates."""
        shape_node = node.args[0] if node.args else None
        dtype_node = node.args[1] if len(node.args) > 1 else next(
            (k.value for k in node.keywords if k.arg == "dtype"), None)
        if shape_node is None or dtype_node is None:
            raise self.fail(f"cuda.{kind}.array without a shape and a dtype", node)
        try:
            env = {"np": np, "numba": numba, "math": math}
            shape = eval(compile(ast.Expression(self.visit(shape_node)), "<shape>", "eval"), env)  # noqa: S307
            dtype = dtype_of(eval(compile(ast.Expression(self.visit(dtype_node)), "<dtype>", "eval"), env))  # noqa: S307
        except Unsupported:
            raise
        except Exception as error:
            raise self.fail(f"cuda.{kind}.array whose shape or dtype is not a constant ({error})", node) from None
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        if kind == "local" and not self.inline:   # a helper's local array lives for one call
            return _expr(f"np.empty({shape!r}, np.{'bool_' if dtype.kind == 'b' else dtype.name})")
        dynamic = kind == "shared" and shape in ((0,), ())
        key = (self.fn.__code__, node.lineno, node.col_offset) if not dynamic else "dynamic"
        found = self.unit.storage.get(key)
        if found is None:
            prefix = "cu_sh" if kind == "shared" else "cu_lo"
            name = "cu_dsh" if dynamic else f"{prefix}{len(self.unit.storage)}"
            found = Storage(name, "dynamic" if dynamic else kind, shape, dtype, location(self.fn, node))
            self.unit.storage[key] = found
        if dynamic:
            self.context.update(("cu_sb",))
            size = dtype.itemsize
            return _expr(f"cu_dsh[cu_sb][:cu_dsh.shape[1] // {size} * {size}].view(np.{dtype.name})")
        index = "cu_sb" if kind == "shared" else "cu_g"
        self.context.add(index)
        return _expr(f"cu_rt.fixed_shape({found.name}[cu_sb], {shape!r})" if kind == "shared" else f"{found.name}[cu_g]")

    # ---- statements ---------------------------------------------------------------

    def block(self, statements: list) -> list:
        out = []
        for stmt in statements:
            out.extend(self.statement(stmt))
        return out

    def statement(self, stmt) -> list:
        out = self._statement(stmt)
        where = location(self.fn, stmt)
        for new in out:   # fission.py names regions and barriers by these
            if not hasattr(new, "cu_where"):
                new.cu_where = where
        return out

    def _statement(self, stmt) -> list:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda, ast.Global,
                             ast.Nonlocal, ast.Try, ast.With, ast.AsyncWith, ast.AsyncFor, ast.Import,
                             ast.ImportFrom, ast.Delete)):
            raise self.fail(f"a {type(stmt).__name__} statement", stmt)
        if isinstance(stmt, ast.Return) and self.inline and self.prefix:
            raise self.fail("a return before the end of an inlined device function", stmt)
        marker = self.marker(stmt)
        if marker is not None:
            return marker
        call, target = self.inline_call(stmt)
        if call is not None:
            return self.inline_function(call, target, stmt)
        if isinstance(stmt, (ast.If, ast.While, ast.For)):
            if getattr(stmt, "orelse", None) and isinstance(stmt, (ast.While, ast.For)):
                raise self.fail(f"{type(stmt).__name__.lower()}-else", stmt)
            new = type(stmt)(**{f: getattr(stmt, f) for f in stmt._fields})
            for field in ("test", "target", "iter"):
                if hasattr(stmt, field):
                    setattr(new, field, self.visit(getattr(stmt, field)))
            new.body = self.block(stmt.body) or [ast.Pass()]
            new.orelse = self.block(stmt.orelse)
            return [ast.copy_location(new, stmt)]
        return [self.visit(stmt)]

    def marker(self, stmt) -> list | None:
        """Barriers and fences as statements; ``g = cuda.cg.this_grid()`` disappears (g.sync() is the barrier)."""
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name) \
                and isinstance(stmt.value, ast.Call) and cuda_path(stmt.value.func, self.resolve) == ["cg", "this_grid"]:
            self.grid_aliases.add(stmt.targets[0].id)
            return []
        if not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)):
            return None
        func = stmt.value.func
        path = cuda_path(func, self.resolve)
        if path == ["syncthreads"]:
            return [self.barrier("cu_syncthreads", [], stmt)]
        if isinstance(func, ast.Attribute) and func.attr == "sync" and (
                (isinstance(func.value, ast.Name) and func.value.id in self.grid_aliases)
                or (isinstance(func.value, ast.Call) and cuda_path(func.value.func, self.resolve) == ["cg", "this_grid"])):
            return [self.barrier("cu_grid_sync", [], stmt)]
        if path and path[0] in _FENCES:
            self.unit.fences = True
            return []
        if isinstance(func, ast.Name) and func.id not in self.locals:
            value = self.resolve(func.id)
            if value is not None and is_device_function(value) and is_group_barrier(value):
                if len(stmt.value.args) != 3:
                    raise self.fail("group_barrier(state, slot, members) with other arguments", stmt)
                return [self.barrier("cu_group_barrier", [self.visit(a) for a in stmt.value.args], stmt)]
        return None

    def barrier(self, name: str, args, stmt) -> ast.stmt:
        self.unit.barriers.add(BARRIERS[name])
        return ast.copy_location(ast.Expr(_call(name, args)), stmt)

    def inline_call(self, stmt):
        """(call, target name or None) if ``stmt`` calls a device function that must be inlined."""
        if isinstance(stmt, ast.Expr):
            call, target = stmt.value, None
        elif isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and (
                isinstance(stmt.targets[0], ast.Name) or isinstance(stmt.targets[0], ast.Tuple)
                and all(isinstance(e, ast.Name) for e in stmt.targets[0].elts)):
            call, target = stmt.value, stmt.targets[0]
        else:
            return None, None
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)) or call.func.id in self.locals:
            return None, None
        value = self.resolve(call.func.id)
        if value is None or not is_device_function(value):
            return None, None
        if not needs_inline(python_function(value), self.unit.facts):
            return None, None
        return call, target

    def inline_function(self, call: ast.Call, target, stmt) -> list:
        """A call of a device function with barriers: arguments into its parameters, then ``cu_call(K)``.

        The function is translated once, as unit ``K`` (its names prefixed ``fK_``); ``fission.py``
        writes its code once and runs it wherever a ``cu_call(K)`` marker stands, so a uTask called
        from forty places of a Cocktailer kernel is compiled once.  ``x = f(...)`` reads ``fK_ret``.
        """
        fn = python_function(self.resolve(call.func.id))
        if call.keywords or any(isinstance(a, ast.Starred) for a in call.args):
            raise self.fail(f"{fn.__name__}() called with keywords or *args", stmt)
        unit = self.unit.unit_for(fn, stmt, self)
        if len(unit.params) != len(call.args):
            raise self.fail(f"{fn.__name__}() called with {len(call.args)} arguments for {len(unit.params)}", stmt)
        out = [ast.copy_location(ast.Assign([ast.Name(p, ast.Store())], self.visit(a)), stmt)
               for p, a in zip(unit.params, call.args)]
        out.append(ast.copy_location(ast.Expr(_call("cu_call", [ast.Constant(unit.id)])), stmt))
        if target is not None:
            if not unit.returns:
                raise self.fail(f"{fn.__name__}() returns nothing but its result is used", stmt)
            out.append(ast.copy_location(ast.Assign([self.visit(target)], ast.Name(f"f{unit.id}_ret", ast.Load())),
                                         stmt))
        return out

    # ---- helpers (device functions without barriers) ------------------------------

    def helper(self, fn) -> Helper:
        found = self.unit.helpers.get(fn)
        if found is not None:
            if found.tree is None:   # a recursive call: it cannot need coordinates it has not been seen to use
                return found
            return found
        helper = self.unit.helpers[fn] = Helper(f"cu_dev_{fn.__name__}_{len(self.unit.helpers)}")
        tree = parse_def(fn)
        if tree.args.vararg or tree.args.kwarg or tree.args.defaults or tree.args.kwonlyargs:
            raise Unsupported(f"device function {fn.__name__} with defaults, *args or keywords", location(fn, tree))
        inner = _Rewriter(self.unit, fn, tree, prefix="", inline=False)
        body = inner.block(tree.body) or [ast.Pass()]
        helper.context = tuple(c for c in CONTEXT if c in inner.context)
        args = ast.arguments(posonlyargs=[], args=[ast.arg(a.arg) for a in tree.args.args]
                             + [ast.arg(c) for c in helper.context],
                             vararg=None, kwonlyargs=[], kw_defaults=[], kwarg=None, defaults=[])
        helper.tree = ast.FunctionDef(helper.name, args, body, [], None, None, lineno=tree.lineno)
        helper.tree.source_where = location(fn, tree)
        self.unit.helper_order.append(fn)
        return helper

    def visit_Return(self, node: ast.Return):
        return self.generic_visit(node)

    def generic_visit(self, node):
        if isinstance(node, (ast.Lambda, ast.Yield, ast.YieldFrom, ast.Await, ast.NamedExpr, ast.ListComp,
                             ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            raise self.fail(f"a {type(node).__name__}", node)
        return super().generic_visit(node)
