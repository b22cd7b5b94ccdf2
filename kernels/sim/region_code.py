"""One region's code for one thread: how it ends, and where its small local arrays live meanwhile.

The writer (``writer.py``) turns each region of a kernel (the code between two barriers,
``fission.py``) into a node function run once per thread.  Two things about that function's body:

* **How it ends** (``StatusRewriter``): ``return`` in a kernel ends the thread (``EXITED``); a
  ``break``/``continue`` of a block-level loop stores the thread's variables, then reports
  ``BROKE``/``CONTINUED`` to the driver; a ``while`` loop asks on every turn whether the launch
  was cancelled (Ctrl-C, a hang), so a spin loop cannot outlive it.
* **Small local arrays on the stack** (``on_stack``): a thread's ``cuda.local.array`` lives in
  the launch's table of local memory, since it may outlive a barrier.  Inside one region the node
  copies a small one to an array on its own stack (``cpu_runtime.stack_array``), works on that,
  and copies it back at every way out.  The copy's shape and address are constants LLVM can see,
  so it keeps the elements in registers: a register-tiled matmul's accumulators cost no memory
  traffic, as on a GPU.
"""

from __future__ import annotations

import ast
import math

__all__ = ["StatusRewriter", "copy_statement", "on_stack", "stack_declarations", "STACK_ELEMENTS"]

STACK_ELEMENTS = 64   # a local array up to this size is worked on from the stack within a region


def _small_locals(storage) -> list:
    return [s for s in storage if s.kind == "local" and math.prod(s.shape) <= STACK_ELEMENTS]


def stack_declarations(storage) -> list:
    """The module's lines that make a stack-array function per small local array (``cu_loK_on_stack``)."""
    lines = []
    for s in _small_locals(storage):
        dtype = "bool_" if s.dtype.kind == "b" else s.dtype.name
        lines.append(f"{s.name}_on_stack = cu_rt.stack_array({tuple(s.shape)!r}, np.{dtype})")
    return lines


def on_stack(region, reads: set, storage, remat: dict, kept_arrays: set) -> dict:
    """The thread's local arrays ``region`` can work on as a stack copy: {variable: storage name}.

    Those that are small, only indexed here (``acc[i, j]``: never passed on whole or renamed),
    while the region keeps no array variable across a barrier (``kept_arrays``: a view into the
    copy would outlive it).  ``remat`` maps a variable to the expression every region recomputes
    it with: ``cu_loK[cu_g]`` for a local array.
    """
    if set().union(*(_stored_names(s) for s in region.stmts)) & kept_arrays:
        return {}
    small = {s.name for s in _small_locals(storage)}
    indexed = {id(n.value) for s in region.stmts for n in ast.walk(s) if isinstance(n, ast.Subscript)}
    found = {}
    for v in sorted(reads & set(remat)):   # sorted: the generated text (and its cache name) the same in every process
        expr = remat[v]
        if not (isinstance(expr, ast.Subscript) and isinstance(expr.value, ast.Name)
                and expr.value.id in small and ast.unparse(expr.slice) == "cu_g"):
            continue
        uses = [n for s in region.stmts for n in ast.walk(s) if isinstance(n, ast.Name) and n.id == v]
        if all(id(n) in indexed for n in uses):
            found[v] = expr.value.id
    return found


def _stored_names(node) -> set:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}


class StatusRewriter(ast.NodeTransformer):
    """In a region: ``return`` ends the thread; a block-level break / continue stores, then reports."""

    def __init__(self, stores: list):
        self.stores = [ast.parse(s).body[0] for s in stores]
        self.depth = 0

    def visit_Return(self, node):
        return ast.copy_location(ast.Return(_runtime_name("EXITED")), node)

    def loop(self, node):
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1
        if isinstance(node, ast.While):   # a spin loop must not outlive a cancelled launch
            check = ast.parse("if cu_rt.cancelled(cu_cancel):\n    return cu_rt.STOPPED").body[0]
            node.body.insert(0, check)
        return node

    visit_For = visit_While = loop

    def leave(self, node, status: str):
        if self.depth:
            return node
        return [*(copy_statement(s) for s in self.stores), ast.Return(_runtime_name(status))]

    def visit_Break(self, node):
        return self.leave(node, "BROKE")

    def visit_Continue(self, node):
        return self.leave(node, "CONTINUED")


def _runtime_name(name: str) -> ast.expr:
    """``cu_rt.NAME``: generated code reaches cpu_runtime through one cu_ name, which no kernel variable can hide."""
    return ast.Attribute(ast.Name("cu_rt", ast.Load()), name, ast.Load())


def copy_statement(node):
    return ast.parse(ast.unparse(node)).body[0] if isinstance(node, ast.stmt) else node
