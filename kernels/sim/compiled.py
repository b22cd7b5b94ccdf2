"""The simulator's compiled tier: a kernel's own source, as loops over blocks and threads, run by numba.njit.

Pipeline (one ``CompiledKernel`` per ``SimKernel``):

1. ``translate.translate``: the source, with ``cuda`` made plain (once per kernel);
2. ``fission.split``: regions between barriers and the control flow around them;
3. for kernels with barriers, the types of the variables that live across regions:
   the body is compiled once as a plain function (barriers removed, the "shadow")
   and numba's type inference is asked (once per argument types; ``shadow_types.var_types``);
4. ``writer.write_module``: a Python module of ``njit`` functions, written to the
   cache directory under a name made from its text (``module_cache.py``:
   ``PYFLOW_SIM_CACHE``, default ``~/.cache/pyflow/sim``), so numba's ``cache=True``
   keeps the machine code between runs, and a student can open the file;
5. a launch runs ``_drive`` (``cu_launch``: blocks one after another, or, when the blocks
   never meet, ranges of blocks on several cores at once; with grid barriers, the compiled
   control machine stepping through the nodes for the whole grid), on the caller's thread
   watched by ``workers``' hang watch, or, called from the main thread, on a worker thread
   while the caller watches (``workers.py`` says why): an exception names the block and
   thread (``where``), Ctrl-C and a kernel making no progress for ``hang_timeout``
   seconds stop it (``cancel``), and the result code
   becomes the threaded tier's error (``DivergentBarrierError``, ``GridSyncExitError``...).

``Unsupported`` from steps 1-4 means "run this launch threaded"; it is raised before
anything runs.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import inspect
import threading
import time

import numba
import numpy as np
from numba.core import types as nbtypes

from pyflow.errors import DeadlockError, DivergentBarrierError, GridSyncExitError, KernelError, KernelHangError

from . import cpu_runtime, grid_machine, scopes, workers
from .blockwise import element_thread
from .fission import Region, split, variables
from .module_cache import compiled_before, load_module
from .shadow_types import var_types
from .translate import translate
from .translation import Unsupported
from .workers import thread_compiling as _compiling, thread_doing as _doing
from .writer import write_module

__all__ = ["CompiledKernel", "Unsupported"]

_IMPORTS = """import math
import numba
import numpy as np
from numba.typed import Dict
from pyflow.kernels.sim import cpu_runtime as cu_rt
from pyflow.kernels.sim import grid_machine as cu_gm
from pyflow.kernels.sim.scopes import (
    RUN, TEST, IF_SPLIT, IF_ELSE, IF_JOIN, LOOP_ENTER, WHILE_COND, LOOP_BACK, FOR_BOUNDS, FOR_GROUP, FOR_CHECK, ASSIGN,
    FOR_BACK, LOOP_EXIT, GRID, GROUP, END)
"""
# a change to the runtime helpers must not reuse machine code compiled against the old ones
_RUNTIME_STAMP = hashlib.sha1((inspect.getsource(cpu_runtime) + inspect.getsource(scopes)
                                + inspect.getsource(grid_machine)).encode()).hexdigest()[:12]
_POLL_SECONDS = 0.02
# A core is worth its hand-off for a range of blocks with this much work (threads, elements, or the operation's
# own measure: a matmul's multiply-adds).  The hand-off is a pool thread that must take the GIL to start, and on a
# VM's stream the main thread and the VM's threads hold it in turns: for an MLP step's 16k-50k element launches
# (its bias add, ReLU and its gradient, a weight's copy) a second range made them 1.5-3 times slower, and its two
# 12.8M multiply-add matmuls 1.4 times faster.  At 4096 the step was about 1 ms slower than at 131072 (median of 25
# alternating steps, twice; 784 -> 256 -> 10, batch 64).
_MIN_PART_WORK = 1 << 17


def constant_tuples(args) -> tuple:
    """``(index, value)`` of each argument that is a tuple of ints all 0 or 1: a dense operand's strides (``(1,)``
    once the host merged its dims), a broadcast one's (``(0,)``), zip's steps (``(1, 0)``: an array and a
    number).  A module compiled for them, for a kernel without barriers, holds them as constants (``_source``), so
    ``x[i * strides[0]]`` is ``x[i]`` to LLVM, which then vectorizes the loop: a dense 200k-element ``add`` or
    optimizer update went from 270-360 us to 70-80 (``x[i * s]`` with an ``s`` it cannot see is a gather).
    Another value, or a launch with other strides of the same types, gets its own module
    (``tiers.argument_key`` tells them apart).

    >>> constant_tuples([np.zeros(3), (1,), (4, 1), (1, 0), 1, (True,)])
    ((1, (1,)), (3, (1, 0)))
    """
    return tuple((i, a) for i, a in enumerate(args) if type(a) is tuple and a and a.count(0) + a.count(1) == len(a)
                 and all(type(v) is int for v in a))


def block_ranges(blocks: int, work: int, independent: bool, cores: int) -> list:
    """The ranges of blocks a launch runs at once, one per core: ``[(0, blocks)]`` unless its blocks are
    independent (``Translation.blocks_independent``) and each range gets enough ``work`` (the launch's
    threads, its largest array's elements or its operation's work, whichever is more) to pay for a core.

    >>> block_ranges(8, 1 << 18, True, 2), block_ranges(8, 1 << 18, False, 2), block_ranges(2, 64, True, 2)
    ([(0, 4), (4, 8)], [(0, 8)], [(0, 2)])
    """
    n = max(1, min(cores, blocks, work // _MIN_PART_WORK)) if independent else 1
    bounds = [blocks * i // n for i in range(n + 1)]
    return list(zip(bounds[:-1], bounds[1:]))


class _PartFailed(Exception):
    """Range ``part`` of a launch's blocks raised ``error``."""

    def __init__(self, part: int, error: BaseException):
        super().__init__(part, error)
        self.part, self.error = part, error


class _Prepared:
    """One argument-types' compiled module and what its errors need to be told."""

    def __init__(self, module, nodes, source_path, independent: bool):
        self.module, self.nodes, self.source_path = module, nodes, source_path
        self.independent = independent   # its blocks may run on several cores at once


class CompiledKernel:
    """The compiled tier of one ``SimKernel``: translated once, a module per argument types."""

    def __init__(self, kernel):
        self.kernel = kernel
        self.name = kernel.__name__
        self.lock = threading.Lock()
        self._translated = None     # (Translation, Split) or Unsupported
        self._prepared: dict = {}   # argument types -> _Prepared or Unsupported
        self.compile_seconds = 0.0
        self.last_ranges = 0        # how many ranges of blocks (cores) the last launch ran on

    # ---- translation and compilation ---------------------------------------------

    def translated(self):
        if self._translated is None:
            try:
                tr = translate(self.kernel.py_func)
                self._translated = (tr, split(tr.body, tr.units))
            except Unsupported as error:
                self._translated = error
            except SyntaxError as error:   # unparse/parse round trips of odd sources
                self._translated = Unsupported(f"the translated source did not parse ({error})")
        if isinstance(self._translated, Unsupported):
            raise self._translated
        return self._translated

    @property
    def cooperative(self) -> bool:
        tr, _ = self.translated()
        return bool(tr.barriers & {"grid", "group"})

    def prepare(self, args, boundscheck: bool = True) -> _Prepared:
        """The compiled launch for these arguments' types (and its ``constant_tuples``); ``Unsupported`` if numba
        cannot take them."""
        types, constants = tuple(numba.typeof(a) for a in args), self._constants(args)
        key = (types if boundscheck else types + ("unchecked",)) + (("constants",) + constants if constants else ())
        with self.lock:
            found = self._prepared.get(key)
            if found is None:
                started = time.perf_counter()
                try:
                    found = self._build(types, boundscheck, constants)
                except Unsupported as error:
                    found = error
                except Exception as error:   # numba's typing and lowering errors
                    found = Unsupported(f"numba could not compile it for {', '.join(map(str, types))}: "
                                        f"{type(error).__name__}: {_first_line(error)}")
                self.compile_seconds += time.perf_counter() - started
                self._prepared[key] = found
        if isinstance(found, Unsupported):
            raise found
        return found

    def _constants(self, args) -> tuple:
        """``constant_tuples(args)`` for a kernel without barriers (one region: a grid-stride loop, what LLVM
        vectorizes); () for any other, which keeps one module, and one prepared launch, for all values (a matmul's
        or a reduction's strides gain nothing, and every module is a compile of its own: 10 s a matmul variant)."""
        tr, sp = self.translated()
        one_region = len(sp.all_nodes) == 1 and isinstance(sp.nodes[0], Region)
        return constant_tuples(args) if one_region and not tr.barriers else ()

    def compiled_before(self, args, boundscheck: bool = True) -> bool:
        """Did a run before this one leave this launch's machine code in the cache directory
        (``module_cache.compiled_before``)?  Then ``prepare`` only loads it, in milliseconds: ``auto`` takes
        the compiled tier at once (``tiers.py``).  Compiles nothing to find out: False for a kernel whose
        threads' variable types were not remembered (that would take a compile of its own), or that the
        compiled tier cannot take."""
        try:
            types = tuple(numba.typeof(a) for a in args)
            with self.lock:
                text = self._source(types, boundscheck, remembered_only=True, constants=self._constants(args))
        except Exception:  # noqa: BLE001 - Unsupported, or numba's typeof: not compiled before, as far as we know
            return False
        if text is None:
            return False
        tr = self.translated()[0]
        entries = (("cu_run", "cu_drive") if _COMPILED_MACHINE else ("cu_run",)) if self.cooperative else ("cu_launch",)
        return compiled_before(text[0], tr.name, entries)

    def _source(self, types, boundscheck: bool, bare: bool | None = None, remembered_only: bool = False,
                constants: tuple = ()):
        """(the module's text for these argument types, whether it is ``bare``); None if ``remembered_only`` and
        the threads' variable types were not remembered (``shadow_types.var_types``).  ``bare`` None: bare
        unless a variable kept per thread needs numba's reference counts.  ``constants``: the arguments (index,
        value) that are tuples of 0s and 1s, constants in this module (``constant_tuples``)."""
        tr, sp = self.translated()
        if len(types) != len(tr.params):
            raise Unsupported(f"{len(types)} arguments for {len(tr.params)} parameters")
        param_types = dict(zip(tr.params, types))
        var = variables(sp, tr.params, param_types)
        storage_types = var_types(tr, var, types, remembered_only) if var.stored else {}
        if storage_types is None:
            return None
        header = (f"Kernel {tr.name!r} ({tr.where}) for the simulator's compiled tier, written by\n"
                  f"pyflow.kernels.sim.fission; runtime {_RUNTIME_STAMP}; argument types:\n"
                  + "".join(f"  {p}: {t}\n" for p, t in param_types.items()))
        if not boundscheck:
            header += "indexes unchecked (PYFLOW_SIM_BOUNDSCHECK=0)\n"
        fixed = {tr.params[i]: value for i, value in constants}
        if fixed:
            header += f"constant: {', '.join(f'{p} = {value}' for p, value in fixed.items())}\n"
        if bare is None:   # (per-thread code without reference counts where it can do without: cpu_runtime.BARE;
            # typed dicts need them, and numba says so only when it compiles)
            bare = all(not t.startswith("numba.") for t in storage_types.values())
        return write_module(tr, sp, var, storage_types, self.cooperative, header, _IMPORTS, boundscheck, bare,
                            fixed), bare

    def _build(self, types, boundscheck: bool = True, constants: tuple = ()) -> _Prepared:
        """Translate, split, type, write and compile: the module that runs this kernel for these types."""
        tr, sp = self.translated()
        source, bare = self._source(types, boundscheck, constants=constants)
        while True:
            module = load_module(source, tr.name)
            storage = tuple(numba.typeof(x) for x in module.cu_allocate(1, 1, 0))
            try:
                if self.cooperative:
                    tail = ((nbtypes.boolean[::1],) + (nbtypes.int64[::1],) * 3 + (nbtypes.int64,) * 6 + tuple(types)
                            + storage)
                    module.cu_run.compile((nbtypes.int64,) * 4 + (nbtypes.int64[::1], nbtypes.int64) + tail)
                    if _COMPILED_MACHINE:   # before the launch: a compile is no progress to the hang watch
                        state = tuple(numba.typeof(a) for a in grid_machine.new_state(module.CODE_OPS, 1))
                        module.cu_drive.compile((numba.typeof(module.CODE_OPS),) + state + tail)
                else:
                    module.cu_launch.compile((nbtypes.int64,) * 2 + (nbtypes.int64[::1],) * 3 + (nbtypes.int64,) * 6
                                             + tuple(types) + storage)
                return _Prepared(module, sp.all_nodes, module.__file__, tr.blocks_independent)
            except Exception:
                if not bare:
                    raise
                bare = False   # something in the kernel needs numba's runtime: count references
                source, _ = self._source(types, boundscheck, bare, constants=constants)

    # ---- a launch ---------------------------------------------------------------

    def launch(self, prepared: _Prepared, grid, block, dynshared: int, args, hang_timeout, cores: int = 1,
               launch_work: int = 0) -> None:
        """Run the launch (``cores``: how many CPU cores its blocks may use, ``block_ranges``, given its work as
        ``tiers.launch_work`` measures it): on this thread, watched by ``workers``' hang watch, unless this is
        the main thread, which hands it to a worker and watches it itself (``_watch``), so that Ctrl-C reaches
        it (``workers.py``)."""
        blocks = grid[0] * grid[1] * grid[2]
        ranges = block_ranges(blocks, launch_work, prepared.independent and not prepared.module.COOPERATIVE, cores)
        self.last_ranges = len(ranges)
        report = np.zeros((len(ranges), 8), np.int64)   # a row per range of blocks
        where = np.full((len(ranges), 4), -1, np.int64)
        cancel = np.zeros(1, np.int64)
        worker: list = []

        def work():
            worker.append(threading.get_ident())
            if len(ranges) == 1:
                return 0, _drive(prepared.module, grid, block, dynshared, args, report[0], where[0], cancel)
            return _drive_ranges(prepared.module, ranges, grid, block, dynshared, args, report, where, cancel)

        progress = workers.Progress(self.name, where, cancel, hang_timeout, worker)
        try:
            if threading.current_thread() is not threading.main_thread() and workers.watch(progress):
                part, code = self._run_inline(work, progress)
            else:   # the main thread stays free for Ctrl-C (workers.py)
                future = workers.launch_submit(work)
                try:
                    part, code = self._watch(future, where, cancel, hang_timeout, worker)
                except KeyboardInterrupt:
                    workers.stop(future, cancel)
                    raise
        except (KernelHangError, KeyboardInterrupt):
            raise
        except _PartFailed as failed:
            raise self._located(failed.error, prepared, grid, block, where[failed.part]) from failed.error
        except Exception as error:
            raise self._located(error, prepared, grid, block, where[0]) from error
        if code != cpu_runtime.OK:
            raise self._failure(code, prepared, grid, block, report[part])

    @staticmethod
    def _run_inline(work, progress):
        """Run the launch on this thread, watched by ``workers``' hang watch; ``KernelHangError`` if the
        watch stopped it."""
        try:
            outcome = work()
        except Exception as error:
            if progress.doing is not None:
                raise KernelHangError(progress.message(stopped=True)) from error
            raise
        finally:
            workers.unwatch(progress)
        if progress.doing is not None:
            raise KernelHangError(progress.message(stopped=True))
        return outcome

    def _watch(self, future, where, cancel, hang_timeout, worker):
        """Wait for a launch running on a worker; stop it and raise ``KernelHangError`` if it hangs."""
        progress = workers.Progress(self.name, where, cancel, hang_timeout, worker)
        while True:
            try:
                return future.result(timeout=_POLL_SECONDS)
            except concurrent.futures.TimeoutError:
                pass
            if progress.hung(time.monotonic()):
                progress.doing = _doing(worker)
                raise KernelHangError(progress.message(stopped=workers.stop(future, cancel)))

    def _located(self, error, prepared, grid, block, where) -> KernelError:
        """An exception in compiled code, with the block, thread and region it happened in."""
        node = prepared.nodes[where[3]] if 0 <= where[3] < len(prepared.nodes) else None
        at = f" in {'region' if isinstance(node, Region) else 'the test at'} {node.where}" if node else ""
        block_idx, thread_idx = (_coords(n, dims) for n, dims in zip(element_thread(where, grid, block), (grid, block)))
        return KernelError(
            f"kernel {self.name!r} failed in threadIdx={thread_idx} blockIdx={block_idx}{at} "
            f"(compiled tier): {type(error).__name__}: {error}",
            kernel=self.name, thread_idx=thread_idx, block_idx=block_idx)

    def _failure(self, code, prepared, grid, block, report):
        node = prepared.nodes[report[3]] if 0 <= report[3] < len(prepared.nodes) else None
        at = node.where if node is not None else "?"
        block_idx, thread_idx = _coords(report[1], grid), _coords(report[2], block)
        if code == cpu_runtime.DIVERGENT:
            what = "barrier" if isinstance(node, Region) else f"{getattr(node, 'kind', '')} around barriers"
            return DivergentBarrierError(
                f"kernel {self.name!r}: divergent {what} in block {block_idx}: thread {thread_idx} does not take "
                f"the way the block's other threads take at {at}; every thread of a block must reach the same "
                "barriers (compiled tier)")
        if code == cpu_runtime.GRID_EXIT:
            return GridSyncExitError(
                f"kernel {self.name!r}: a thread exited, and others reached the grid barrier at {at}; on a GPU "
                "this grid barrier would hang (every thread must reach every grid sync: no early return)")
        if code == cpu_runtime.GRID_PARTIAL:
            return DivergentBarrierError(
                f"kernel {self.name!r}: the grid barrier at {at} is reached by {report[4]} of the grid's blocks "
                "only (it sits in code that some blocks skip); the compiled tier needs every block there; "
                "PYFLOW_SIM_TIER=threads runs it as written")
        if code == cpu_runtime.GROUP_MISMATCH:
            return DeadlockError(
                f"kernel {self.name!r}: group_barrier at {at} expects {report[4]} blocks, but {report[5]} reach it "
                f"together (block {block_idx}); on a GPU it would wait forever or open early")
        if code == cpu_runtime.CANCELLED:
            return KeyboardInterrupt()
        return KernelError(f"kernel {self.name!r}: compiled launch ended with code {code}", kernel=self.name)


# False: drive cooperative launches with scopes.Machine in Python (to step through it; the tests compare both)
_COMPILED_MACHINE = True
_RUN_KIND = {scopes.RUN: 0, scopes.ASSIGN: 0, scopes.TEST: 1, scopes.GROUP: 1, scopes.FOR_BOUNDS: 2}


def _drive(module, grid, block, dynshared, args, report, where, cancel) -> int:
    """One launch: ``cu_launch`` (no grid barriers), or the grid driven by a ``scopes.Machine`` that calls
    ``module.cu_run`` for each node."""
    threads, blocks = block[0] * block[1] * block[2], grid[0] * grid[1] * grid[2]
    dims = (grid[0], grid[1], grid[2], block[0], block[1], block[2])
    if not module.COOPERATIVE:   # blocks one after another, each through compiled control flow
        return _drive_blocks(module, 0, blocks, grid, block, dynshared, args, report, where, cancel)
    storage = module.cu_allocate(blocks, threads, dynshared)
    alive = np.ones(blocks * threads, np.bool_)
    module.cu_start_batch(storage, args)
    if _COMPILED_MACHINE:   # the whole launch in numba (grid_machine.py); the loop below is the same, in Python
        state = grid_machine.new_state(module.CODE_OPS, blocks)
        return module.cu_drive(module.CODE_OPS, *state, alive, where, report, cancel, *dims, *args, *storage)
    machine = scopes.Machine(module.CODE, np.arange(blocks))
    while True:
        op, node, _, flag = machine.next()
        if op == scopes.END:
            return cpu_runtime.OK
        if cancel[0]:
            return cpu_runtime.CANCELLED
        here = machine.scope
        if op == scopes.GRID:   # every block of the grid is here, and no thread has gone
            code = grid_machine.check_grid_barrier(here, alive, threads, report, node)
            if code != cpu_runtime.OK:
                return code
            machine.take(here)
            continue
        it = machine.counter if op == scopes.ASSIGN else 0
        code, results, bounds, live = module.cu_run(_RUN_KIND[op], node, flag, it, here, 0, alive, where, report,
                                                 cancel, *dims, *args, *storage)
        if code != cpu_runtime.OK:
            return code
        if op == scopes.GROUP:   # each group's blocks got here together, as many as its members
            code = grid_machine.check_group_barrier(here, results, report, node)
            if code != cpu_runtime.OK:
                return code
        machine.take(results, bounds, live)


def _drive_blocks(module, first, end, grid, block, dynshared, args, report, where, cancel) -> int:
    """Blocks ``first`` to ``end - 1`` of a launch without grid barriers, one after another, with shared and
    per-thread memory of their own (one block's worth)."""
    dims = (grid[0], grid[1], grid[2], block[0], block[1], block[2])
    storage = module.cu_allocate(1, block[0] * block[1] * block[2], dynshared)
    return module.cu_launch(first, end, where, report, cancel, *dims, *args, *storage)


def _drive_ranges(module, ranges, grid, block, dynshared, args, report, where, cancel) -> tuple:
    """Independent blocks on several cores: range 0 on this thread, the others on the part pool (the
    compiled code holds no GIL).  ``(range, code)`` of the first range that failed, or ``(0, OK)``.

    A range stops at its first failing block, so the failure reported, the lowest range's, is the one
    a run of the blocks one after another would have met first: the errors do not depend on timing.
    """
    def part(i):
        try:
            return _drive_blocks(module, *ranges[i], grid, block, dynshared, args, report[i], where[i], cancel)
        except Exception as error:   # reported below, in range order
            return _PartFailed(i, error)

    others = [workers.part_submit(lambda i=i: part(i)) for i in range(1, len(ranges))]
    outcomes = [part(0)] + [f.result() for f in others]
    for i, outcome in enumerate(outcomes):
        if isinstance(outcome, _PartFailed):
            raise outcome
        if outcome != cpu_runtime.OK:
            return i, outcome
    return 0, cpu_runtime.OK


def _coords(linear, dims) -> tuple:
    linear = int(linear)
    if dims is None or linear < 0:
        return (linear,)
    x, y = dims[0], dims[1]
    return (linear % x, linear // x % y, linear // (x * y))


def _first_line(error) -> str:
    text = str(error).strip().splitlines()
    return next((line for line in text if line.strip() and not line.startswith("\x1b")), type(error).__name__)
