"""Names in generated code (seed 001): valid, distinct ASCII identifiers, whatever the user called things.

The code generator writes a kernel's parameters, loop counters and frame fields
under the names the front end gave them in the IR, and names the kernel after the
program.  Those come from the user: a program may be a ``lambda`` (``__name__``
is ``"<lambda>"``), a ``functools.partial`` (no ``__name__`` at all), a nested
function (``outer.<locals>.prog``), a name in Greek, or a function parameter
called ``base``, which is also the name of a frame field.  So:

* ``sanitize(text)`` keeps the ASCII letters, digits and ``_`` of a name (the
  readable name stays in messages and listings; only code uses the sanitized one);
* ``Names`` hands out the names of one trace: ``fresh("walk")`` gives ``walk0``,
  ``walk1``...; ``unique("in_x")`` gives ``in_x``, or ``in_x1`` if that is taken.
  The generated code's own names (``block``, ``top``, ``status``...) are taken
  from the start.

>>> sanitize("<lambda>"), sanitize("outer.<locals>.prog"), sanitize("λ"), sanitize("2nd")
('lambda', 'outer_locals_prog', 'program', 'program_2nd')
>>> names = Names()
>>> names.fresh("<lambda>"), names.fresh("<lambda>"), names.unique("top"), names.unique("top")
('lambda0', 'lambda1', 'top1', 'top2')
"""

from __future__ import annotations

import functools
import re
import unicodedata

__all__ = ["sanitize", "readable_name", "kernel_name", "Names", "GENERATED", "GROUP_LEVELS"]

# Every name the generated kernels use that does not come from the IR (the codegen modules'
# locals and globals, the builtins they call): no IR name may shadow one of them.
# Block groups nested ``L`` deep (recursion unroll) name their variables ``gblockL``..., ``L`` <= GROUP_LEVELS.
GROUP_LEVELS = 8
GENERATED = frozenset(
    "grid block blocks leader barriers u frame label top overflow done g "
    "status cuda jit int64 group_barrier range min max int float bool True False None".split()
    + [f"{stem}{level}" for stem in ("groups", "group", "gfirst", "gblocks", "gblock", "gslot", "failed")
       for level in range(1, GROUP_LEVELS + 1)])


def sanitize(text, default: str = "program") -> str:
    """``text`` as letters, digits and ``_`` (ASCII), not starting with a digit; ``default`` if none are left.

    The result is a valid identifier once a prefix or suffix is added (every
    generated name has one), so a keyword such as ``lambda`` may come back as is.
    """
    ascii_text = unicodedata.normalize("NFKD", str(text)).encode("ascii", "ignore").decode()
    part = re.sub(r"[^A-Za-z0-9_]+", "_", ascii_text).strip("_")
    if not part:
        return default
    return f"{default}_{part}" if part[0].isdigit() else part


def readable_name(fn, default: str = "program") -> str:
    """What to call ``fn`` in messages: its ``__name__``, the wrapped function's for a partial."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    name = getattr(fn, "__name__", None)
    return name if isinstance(name, str) and name else default


def kernel_name(program_name: str, kind: str) -> str:
    """The kernel (a Python function) of a uProgram of ``program_name``: ``rnn_uprogram``."""
    return f"{sanitize(program_name)}_{kind}"


class Names:
    """The code names of one trace: each handed out once, none equal to a generated name."""

    def __init__(self):
        self.taken: set = set(GENERATED)
        self.counts: dict = {}

    def fresh(self, stem, derived=()) -> str:
        """``stem0``, ``stem1``, ... (sanitized): the first free one whose ``derived`` names are free too.

        ``derived`` are format strings (``"stack_{}"``): names the code generator will
        make from this one; they are taken with it.
        """
        stem = sanitize(stem)
        while True:
            n = self.counts.get(stem, 0)
            self.counts[stem] = n + 1
            name = f"{stem}{n}"
            wanted = [name] + [d.format(name) for d in derived]
            if not any(w in self.taken for w in wanted):
                self.taken.update(wanted)
                return name

    def unique(self, name: str) -> str:
        """``name`` (already a valid identifier) if it is free, else ``name1``, ``name2``, ..."""
        candidate, k = name, 0
        while candidate in self.taken:
            k += 1
            candidate = f"{name}{k}"
        self.taken.add(candidate)
        return candidate
