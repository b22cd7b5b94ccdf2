"""What the compiled tier's front end hands on: a ``Translation``, its parts, and ``Unsupported``.

The compiled tier's pipeline is: kernel source -> ``translate.py`` (the source with
``cuda`` made plain, read with ``kernel_source.py``) -> ``fission.py`` (regions between
barriers) -> ``writer.py`` (a module of njit functions) -> ``compiled.py`` (compile and
launch).  This module holds what passes from the first step to the next ones: the
translated kernel (its body, with barriers as marker statements, and the device
functions, shared and local arrays it needs), the names the generated code gives the
simulated thread's coordinates (``CONTEXT``) and its barrier markers (``BARRIERS``),
and ``Unsupported``, which any step raises for what it cannot take (the launch then
runs on the threaded tier, and ``explain`` says why).
"""

from __future__ import annotations

import ast
import dataclasses

import numpy as np

__all__ = ["Unsupported", "Storage", "Helper", "Unit", "Translation", "CONTEXT", "BARRIERS"]

# the simulated thread's coordinates, as the generated loops name them
CONTEXT = ("cu_g", "cu_t", "cu_sb", "cu_tx", "cu_ty", "cu_tz", "cu_bx", "cu_by", "cu_bz",
           "cu_bdx", "cu_bdy", "cu_bdz", "cu_gdx", "cu_gdy", "cu_gdz")
BARRIERS = {"cu_syncthreads": "block", "cu_grid_sync": "grid", "cu_group_barrier": "group", "cu_call": "call"}
class Unsupported(Exception):
    """A construct the compiled tier cannot take: the launch runs on the threaded tier instead."""

    def __init__(self, reason: str, where: str = ""):
        super().__init__(f"{reason} ({where})" if where else reason)
        self.reason, self.where = reason, where


@dataclasses.dataclass(frozen=True)
class Storage:
    """A hoisted ``cuda.shared.array`` (per block) or ``cuda.local.array`` (per thread)."""

    name: str            # cu_sh0, cu_lo1, cu_dsh (dynamic shared memory)
    kind: str            # "shared", "local" or "dynamic"
    shape: tuple
    dtype: np.dtype
    where: str


@dataclasses.dataclass
class Helper:
    """A device function compiled as an njit function of its own (no barriers, no shared memory)."""

    name: str
    tree: ast.FunctionDef | None = None   # None while being translated (recursion)
    context: tuple = ()                   # coordinates it needs, appended to its arguments


@dataclasses.dataclass
class Unit:
    """A device function with barriers or shared memory: translated once, run where ``cu_call(id)`` stands.

    Its names are prefixed ``f<id>_``: parameters (the call site assigns them), locals, and
    ``f<id>_ret``, which its final ``return`` assigns.
    """

    id: int
    name: str
    where: str
    params: list
    body: list | None = None      # None while being translated (a recursive call is refused)
    returns: bool = False


@dataclasses.dataclass
class Translation:
    """A kernel ready for ``fission.py``: its body with markers, and what the body needs."""

    name: str
    where: str                    # file:line of the kernel's def
    params: list
    body: list                    # ast statements; barriers are marker calls
    helpers: list                 # Helper, in an order where callees come first
    storage: list                 # Storage
    barriers: set                 # {"block", "grid", "group"} present in the body or its units
    atomics: bool
    units: list = dataclasses.field(default_factory=list)   # Unit, callees first
    lines: dict = dataclasses.field(default_factory=dict)   # statement id -> "file:line"
    fences: bool = False          # a cuda.threadfence*: blocks talk to each other through memory

    @property
    def blocks_independent(self) -> bool:
        """May the blocks run at the same time on several cores?  Not if they meet: at a grid or group
        barrier, through an atomic (a plain read-modify-write here) or through a fence."""
        return not (self.atomics or self.fences or self.barriers & {"grid", "group"})
