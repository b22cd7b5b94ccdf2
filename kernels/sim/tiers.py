"""Which tier runs a simulated launch: threads (every CUDA thread a Python thread) or compiled (njit loops).

The simulator has two ways to run a kernel, like a language runtime that
interprets first and compiles what is worth compiling:

* **threads** (``grid.py``): every CUDA thread is a Python thread and every barrier
  a real one.  Slow (about 200 us per simulated thread), but it is the debugger's
  tier: ``breakpoint()`` and pdb stop inside a kernel, threads start in a shuffled
  order and can switch at any bytecode (``switch_interval``) so races show up,
  shared memory starts as 0xCD bytes, a deadlock or a hang is reported with a table
  of who waits where;
* **compiled** (``compiled.py``): the kernel's own source as loops over blocks and
  threads split at barriers, compiled by ``numba.njit`` once per argument types.
  Some ns per thread and element: from as fast as numpy to a few times slower
  (``benchmarks/bench_sim_tiers.py``), 100 to 10,000 times faster than threads.
  It keeps the checks that do not need threads: indexes out of range
  (``IndexError`` naming block and thread; ``boundscheck=False`` /
  ``PYFLOW_SIM_BOUNDSCHECK=0`` drops them for speed), divergent barriers, grid
  barriers after an exit, group barriers with the wrong number of blocks, hangs
  (``hang_timeout``) and Ctrl-C.  A block's threads run in a fixed order, one at
  a time, so a race between them cannot show; blocks that never meet (no grid or
  group barrier, atomic or fence) run on up to ``cores`` CPU cores at once.

``PYFLOW_SIM_TIER`` (or ``configure(tier=...)``) chooses:

``auto`` (default)
    compiled for a launch of at least ``BIG_WORK`` (its threads or its largest
    array's elements, whichever is more) or of ``BIG_THREADS`` simulated threads
    (each a Python thread in the other tier: a 128 x 8 @ 8 x 32 matmul launches
    4,096 of them); for a kernel whose launches so far add up to ``HOT_WORK``, or
    whose launch with these argument types is the ``HOT_LAUNCHES``-th; for
    any launch whose compiled code is ready in this process (an earlier launch
    compiled it: nothing is left to pay); and, with ``CACHED_READY``, for the
    ``CACHED_LAUNCHES``-th launch with these argument types (and later ones) whose
    machine code a run before this one left in the cache directory
    (``CompiledKernel.compiled_before``).  Threaded otherwise.  Loading a kernel
    takes 20-50 ms, and the first load of a process 0.1-0.2 s more (numba's CPU
    target), so a kernel launched once or twice stays threaded (a short script,
    the test suite's many subprocesses), and a training script pays its threaded
    launches and its compiles in its first run only: an SGD step of an MLP
    784 -> 256 -> 10 on "cuda" took 0.3-1.3 s for its first 31 steps, then 24-32
    ms; run again, 1.5, 0.8 and 0.45 s for its first three steps (threaded, then
    the loads), then 22-26 ms.
    ``PYFLOW_SIM_REUSE_CACHE=0`` turns ``CACHED_READY`` off.
    A compile costs 0.1-1 s (numba without its disk cache, as in CI's clean clone), a small
    threaded launch 10-15 ms, so a kernel repays its compile after some tens of
    launches, as a training loop's kernels do (an SGD step of a tiny MLP: 65 times
    cpu's time threaded, twice compiled), and a kernel launched a few times does
    not.  ``HOT_LAUNCHES`` is 32, from the test suite: in its boxing and
    simulator tests 20 (kernel, argument types) pairs reach 16 launches, 11 reach
    32, and the launches past the 32nd are 95% of the threaded time past the 16th;
    at 16, hypothesis's 20 examples of a barrier kernel paid its compile for
    4 launches (``tests/test_sim_grid.py``: 5 s to 118 s).  Always threaded:
    ``jit(debug=True)`` kernels and kernels the compiled tier cannot take.  The
    rule counts work and launches, not time, so the same program takes the same
    tiers on any machine, loaded or not, given the same cache directory (the
    tiers' float results may differ in the last bits: numba's math is not
    numpy's; the test suite turns ``CACHED_READY`` off, in its processes and in
    those it starts, so its tiers do not depend on what ran on the machine
    before); a test that needs the threaded
    tier's checks (races, barrier tables, pdb) asks for ``threads``, not for a
    small launch;
``threads``
    always threaded: the simulator as it was before the compiled tier;
``compiled``
    compiled whenever the kernel allows it.

``explain(kernel)`` says which tier a kernel can use and, if only threads, why.
"""

from __future__ import annotations

import contextlib
import os
import threading

import numpy as np

from .compiled import CompiledKernel, Unsupported

__all__ = ["TIERS", "BIG_WORK", "BIG_THREADS", "HOT_WORK", "HOT_LAUNCHES", "CACHED_READY", "CACHED_LAUNCHES",
           "compiled_for", "forget_counts", "argument_key", "operation_work", "launch_work", "explain"]

TIERS = ("auto", "threads", "compiled")
BIG_WORK = 1 << 15      # in auto: threads or array elements that make one launch worth compiling
BIG_THREADS = 1 << 11   # in auto: simulated threads that make one launch worth compiling (each a Python thread)
HOT_WORK = 1 << 19      # in auto: the work of a kernel's launches so far that makes it worth compiling
HOT_LAUNCHES = 32       # in auto: launches of a kernel with the same argument types that make it worth compiling


def _reuse_cache_wanted(environ=os.environ) -> bool:
    """``CACHED_READY``'s value: on unless ``PYFLOW_SIM_REUSE_CACHE`` says 0 (false, no, off).

    >>> _reuse_cache_wanted({}), _reuse_cache_wanted({"PYFLOW_SIM_REUSE_CACHE": "0"})
    (True, False)
    """
    return environ.get("PYFLOW_SIM_REUSE_CACHE", "1").strip().lower() not in ("0", "false", "no", "off")


# in auto: machine code an earlier run left in the cache directory makes a launch compiled, from a kernel's
# CACHED_LAUNCHES-th launch with the same argument types (a load costs about as much as 2-3 small threaded launches)
CACHED_READY = _reuse_cache_wanted()
CACHED_LAUNCHES = 3
_operation = threading.local()   # .work: the operation the launches of this thread belong to (operation_work)


def _compiled(kernel) -> CompiledKernel:
    found = kernel.__dict__.get("_compiled_tier")
    if found is None:
        found = kernel.__dict__["_compiled_tier"] = CompiledKernel(kernel)
    return found


def launch_work(threads: int, args) -> int:
    """A launch's work: its threads, its largest array's elements or its operation's (``operation_work``: a
    matmul's multiply-adds), whichever is more.  It picks the tier (``compiled_for``) and the cores
    (``compiled.block_ranges``)."""
    sizes = [a.size for a in args if isinstance(a, np.ndarray)]
    return max([threads, getattr(_operation, "work", 0)] + sizes)


@contextlib.contextmanager
def operation_work(work: int):
    """The launches made inside (on this thread) are parts of one operation of ``work`` items: each counts
    that work for its tier, so a reduction's small final pass runs on the tier of its big first pass.

    >>> with operation_work(1 << 20):
    ...     launch_work(32, [])
    1048576
    >>> launch_work(32, [])
    32
    """
    outer = getattr(_operation, "work", 0)
    _operation.work = max(outer, work)
    try:
        yield
    finally:
        _operation.work = outer


_counts_epoch = 0   # auto's counts on a kernel (work so far, launches per argument types) belong to one epoch


def forget_counts() -> None:
    """Start ``auto``'s counts afresh for every kernel, as in a new process: the work and launches counted so far
    no longer make a kernel hot (its compiled code, where made, stays ready).  The test suite calls it before each
    test, so a test's tiers do not depend on what the tests before it launched: summed over a whole run, the
    library's elementwise kernels passed ``HOT_WORK`` half-way and every new argument type after that compiled
    (49 compiles, 36 s on a fresh machine, in tests that launch a few small arrays each)."""
    global _counts_epoch
    _counts_epoch += 1


def compiled_for(kernel, threads: int, args, settings, work: int):
    """The kernel's prepared compiled launch for ``args`` (``work``: ``launch_work``'s), or None to run this
    launch threaded."""
    if kernel.__dict__.get("_counts_epoch") != _counts_epoch:   # (``forget_counts`` since the last launch)
        kernel.__dict__.update(_counts_epoch=_counts_epoch, work_so_far=0, _launches_by_key={})
    kernel.work_so_far = getattr(kernel, "work_so_far", 0) + work
    if settings.tier == "threads" or kernel.debug:
        return None
    key = argument_key(args, settings.boundscheck)
    by_key = kernel.__dict__.setdefault("_prepared_by_key", {})   # argument_key -> prepared launch, or None
    launches = kernel.__dict__.setdefault("_launches_by_key", {})  # argument_key -> launches so far
    launches[key] = launches.get(key, 0) + 1
    if settings.tier == "auto" and key not in by_key and not _worth_compiling(work, threads, kernel.work_so_far,
                                                                              launches[key]):
        if not (CACHED_READY and key is not None and launches[key] >= CACHED_LAUNCHES
                and _compiled_before(kernel, key, args, settings.boundscheck)):
            return None
    compiled = _compiled(kernel)
    if key in by_key:
        found = by_key[key]
    else:
        try:
            found = compiled.prepare(args, settings.boundscheck)
        except Unsupported:
            found = None
        if key is not None:
            by_key[key] = found
    return None if found is None else (compiled, found)


def _compiled_before(kernel, key, args, boundscheck: bool) -> bool:
    """Is this launch's machine code in the cache directory from an earlier run (asked once per argument key)?"""
    known = kernel.__dict__.setdefault("_compiled_before_by_key", {})
    if key not in known:
        known[key] = _compiled(kernel).compiled_before(args, boundscheck)
    return known[key]


def _worth_compiling(work: int, threads: int, work_so_far: int, launches: int) -> bool:
    """``auto``'s rule for a launch whose compiled code is not prepared yet (the module docstring).

    >>> _worth_compiling(64, 64, 64, 1), _worth_compiling(64, 64, HOT_WORK, 2)
    (False, True)
    >>> _worth_compiling(BIG_WORK, 64, BIG_WORK, 1), _worth_compiling(64, BIG_THREADS, 64, 1)
    (True, True)
    """
    return work >= BIG_WORK or threads >= BIG_THREADS or work_so_far >= HOT_WORK or launches >= HOT_LAUNCHES


def argument_key(args, boundscheck: bool = True):
    """What decides the compiled launch for ``args``, read without ``numba.typeof`` (tens of us per
    array, which made most of a small launch's cost: 160-250 us per launch with it, 30-40 us without):
    each array's dtype, dimensions, layout and writability, each scalar's type, the value of a tuple of 0s
    and 1s (``compiled.constant_tuples``: a constant of its module); None when only
    ``numba.typeof`` can tell (``CompiledKernel.prepare`` then asks it, at every such launch).

    >>> a = np.zeros((2, 3), np.float32)
    >>> argument_key([a, 3, (1, 2)]) == argument_key([np.ones((4, 5), np.float32), 7, (3, 4)])
    True
    >>> argument_key([(1, 0)]) == argument_key([(0, 1)])   # 0s and 1s: constants of the module (compiled.py)
    False
    >>> argument_key([a.T]) == argument_key([a]), argument_key([1 << 70])
    (False, None)
    """
    keys = [_value_key(a) for a in args]
    return None if None in keys else (*keys, boundscheck)


_INT64_MIN, _INT64_END = -(1 << 63), 1 << 63   # the ints numba.typeof calls int64 (beyond: uint64, or an error)


def _value_key(value):
    kind = type(value)
    if kind is np.ndarray:   # numba.typeof: Array(dtype, ndim, C / F / A layout, readonly)
        flags = value.flags
        return "array", value.dtype, value.ndim, flags.c_contiguous, flags.f_contiguous, flags.writeable
    if kind is int:
        return ("int",) if _INT64_MIN <= value < _INT64_END else None
    if kind is float or kind is bool:
        return (kind.__name__,)
    if isinstance(value, np.number | np.bool_):
        return "scalar", value.dtype
    if kind is tuple:
        if value and set(map(type, value)) == {int} and _INT64_MIN <= min(value) and max(value) < _INT64_END:
            # shapes and strides: UniTuple(int64, n), said at C speed; all 0s and 1s: the compiled code takes the value
            # as a constant (``compiled.constant_tuples``)
            return "ints", len(value), value if value.count(0) + value.count(1) == len(value) else None
        keys = [_value_key(v) for v in value]
        return None if None in keys else ("tuple", *keys)
    return None


def explain(kernel) -> str:
    """Which tiers can run ``kernel`` (a simulated kernel), and why not compiled if it cannot be.

    >>> from pyflow.kernels.examples import prefix_sum
    >>> print(explain(prefix_sum))   # doctest: +ELLIPSIS
    prefix_sum: compiled tier: yes (7 regions, block, grid barriers); threaded tier: yes...
    """
    if getattr(kernel, "debug", False):
        return f"{kernel.__name__}: threaded tier only: launched with jit(debug=True)"
    compiled = _compiled(kernel)
    try:
        tr, sp = compiled.translated()
    except Unsupported as error:
        return f"{kernel.__name__}: threaded tier only: {error}"
    regions = len(sp.regions)
    kinds = sorted(tr.barriers)
    barriers = ", ".join(kinds) + (" barriers" if len(kinds) > 1 else " barrier") if kinds else "no barrier"
    lines = [f"{kernel.__name__}: compiled tier: yes ({regions} region{'s' * (regions != 1)}, "
             f"{barriers}); threaded tier: yes"]
    for types, found in compiled._prepared.items():
        state = f"threaded: {found}" if isinstance(found, Unsupported) else f"compiled ({found.source_path})"
        lines.append(f"  for ({', '.join(map(str, types))}): {state}")
    return "\n".join(lines)
