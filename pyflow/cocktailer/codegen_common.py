"""What every part of a generated kernel shares (seed 001): its status words, and IR scalars as source text.

The kernel writer (``codegen.py``), the recursion machinery
(``codegen_recursion.py``) and the block groups of recursion unroll
(``codegen_groups.py``) all report errors through ``status`` and all spell the
IR's scalars and views as Python expressions; both live here, so none of those
modules imports another one's vocabulary.

``status`` (int64) returns ``[error, detail, barriers, value]``: error 1 is a
stack overflow (detail: function index), 2 a while loop over its cap (detail:
loop index), 3 a run-time index out of its tensor (detail: the check's site,
value: the offset it had).  Every view or load at a run-time offset is checked
before it is used, so a bad index stops the kernel instead of reading or writing
another tensor's memory.  Three words per block group follow: its barrier's count
and generation, and a flag set when the group failed (``gslotL = 4 + 3 * slot``,
the groups of every ``CallGroup`` of a kernel numbered apart).
"""

from __future__ import annotations

from pyflow.cocktailer.ir import Offset, TensorRef
from pyflow.cocktailer.scalars import BinOp, Const, Load, Scalar, Var

__all__ = ["ERR_STACK_OVERFLOW", "ERR_ITERATIONS", "ERR_INDEX", "STATUS_HEAD", "render_scalar", "render_offset",
           "render_view"]

ERR_STACK_OVERFLOW = 1
ERR_ITERATIONS = 2
ERR_INDEX = 3
STATUS_HEAD = 4   # status[:4] = error, detail, barriers, value; then three words per block group


# ---- scalars and views as source text ---------------------------------------------


def render_scalar(s: Scalar, names: dict) -> str:
    """``s`` as a Python expression; ``names`` maps Vars to their source text."""
    if isinstance(s, Const):
        return repr(s.value)
    if isinstance(s, Var):
        return names.get(s, s.name)
    if isinstance(s, Load):
        return f"{s.ref.buffer.name}[{render_offset(s.ref.offset, names)}]"
    if isinstance(s, BinOp):
        return f"({render_scalar(s.a, names)} {s.op} {render_scalar(s.b, names)})"
    raise TypeError(f"not a scalar: {s!r}")


def render_offset(o: Offset, names: dict) -> str:
    if o.dynamic is None:
        return str(o.const)
    dyn = render_scalar(o.dynamic, names)
    return f"{dyn} + {o.const}" if o.const else dyn


def render_view(ref: TensorRef, names: dict) -> str:
    if ref.offset.dynamic is None:
        return f"{ref.buffer.name}[{ref.offset.const}:{ref.offset.const + ref.size}]"
    start = render_offset(ref.offset, names)
    return f"{ref.buffer.name}[{start}:{start} + {ref.size}]"
