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
    array's elements, whichever is more) or ``BIG_THREADS`` simulated threads,
    and for a kernel whose launches so far add up to ``HOT_WORK``; threaded
    otherwise: compiling costs about a second, which a small launch does not
    repay (and the test suite launches thousands of small kernels once or
    twice).  A threaded launch adds to that sum what it cost: its work, and
    ``THREAD_COST`` per simulated thread and per barrier arrival (each a Python
    thread started or put to sleep and woken, as dear as many elements of work),
    so a kernel whose barriers make it slow threaded (a tiled matmul, a block
    reduction) is compiled after few launches, as a JIT compiles a hot loop.
    Always threaded: ``jit(debug=True)`` kernels and kernels the compiled tier
    cannot take.  The rule counts work, threads and arrivals, not time, so the
    same program takes the same tiers on any machine, loaded or not;
``threads``
    always threaded: the simulator as it was before the compiled tier;
``compiled``
    compiled whenever the kernel allows it.

``explain(kernel)`` says which tier a kernel can use and, if only threads, why.
"""

from __future__ import annotations

import numpy as np

from .compiled import CompiledKernel, Unsupported

__all__ = ["TIERS", "BIG_WORK", "BIG_THREADS", "HOT_WORK", "THREAD_COST", "compiled_for", "count_threaded",
           "explain"]

TIERS = ("auto", "threads", "compiled")
BIG_WORK = 1 << 15      # in auto: threads or array elements that make one launch worth compiling
BIG_THREADS = 1 << 11   # in auto: simulated threads that make one launch worth compiling (each a Python thread)
HOT_WORK = 1 << 19      # in auto: the cost of a kernel's launches so far that makes it worth compiling
THREAD_COST = 64        # a simulated thread, or one barrier arrival, counts as this many elements of work


def _compiled(kernel) -> CompiledKernel:
    found = kernel.__dict__.get("_compiled_tier")
    if found is None:
        found = kernel.__dict__["_compiled_tier"] = CompiledKernel(kernel)
    return found


def _work(threads: int, args) -> int:
    sizes = [a.size for a in args if isinstance(a, np.ndarray)]
    return max([threads] + sizes)


def compiled_for(kernel, threads: int, args, settings):
    """The kernel's prepared compiled launch for ``args``, or None to run this launch threaded."""
    work = _work(threads, args)
    kernel.work_so_far = getattr(kernel, "work_so_far", 0) + work
    if settings.tier == "threads" or kernel.debug:
        return None
    if settings.tier == "auto" and work < BIG_WORK and threads < BIG_THREADS and kernel.work_so_far < HOT_WORK:
        return None
    compiled = _compiled(kernel)
    try:
        return compiled, compiled.prepare(args, settings.boundscheck)
    except Unsupported:
        return None


def count_threaded(kernel, threads: int, arrivals: int) -> None:
    """A launch of ``kernel`` ran threaded: add what its threads and barrier arrivals cost to its sum."""
    kernel.work_so_far = getattr(kernel, "work_so_far", 0) + THREAD_COST * (threads + arrivals)


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
