"""pyflow's exception types: one place, below every layer.

Every layer (``pyflow.kernels`` included) raises these, so a user can catch
``PyflowError`` for anything pyflow itself diagnosed.  Each class also derives
from the built-in exception a Python user would expect (``ValueError`` for bad
input, ``RuntimeError`` for failures while running, ``MemoryError`` for OOM), so
``except ValueError`` keeps working.

This module imports nothing from pyflow: it is safe to import from anywhere.
"""

from __future__ import annotations


class PyflowError(Exception):
    """Base class of every error pyflow raises on purpose."""


# --- backend -----------------------------------------------------------------


class BackendError(PyflowError, RuntimeError):
    """The GPU/simulator choice cannot be honoured (e.g. PYFLOW_CUDA=gpu, no driver)."""


# --- devices and streams (seed 000) ------------------------------------------


class DeviceError(PyflowError, ValueError):
    """A device string, type or index is invalid, or the device does not exist."""


class StreamTypeError(PyflowError, ValueError):
    """An unknown stream type, or a stream type a device does not support."""


class StreamExecutionError(PyflowError, RuntimeError):
    """Work queued on a stream failed; raised at the next synchronisation point."""


# --- op arguments (kernels and, later, the framework's ops) -------------------


class ShapeError(PyflowError, ValueError):
    """Shapes that do not fit an op (no broadcast, wrong output shape, mismatched dims)."""


class DTypeError(PyflowError, TypeError):
    """A dtype an op does not accept, or an output whose dtype is not the op's result dtype."""


class AxisError(PyflowError, IndexError, ValueError):
    """An axis out of range for a tensor's rank (like numpy's AxisError)."""


class IndexOutOfRangeError(PyflowError, IndexError):
    """An index (gather, embedding lookup, index_select) outside the indexed dimension."""


class ArgumentTypeError(PyflowError, TypeError):
    """An argument of the wrong Python type: a float or a string where an op needs an int
    (a size, a dim), ``None`` or a string as a fill value, an object that is no tensor."""


# --- memory ------------------------------------------------------------------


class AllocationError(PyflowError, ValueError):
    """An allocation request the allocator cannot interpret (negative or non-integer size)."""


class InvalidFreeError(PyflowError, ValueError):
    """Freeing a pointer the allocator never handed out (or already took back)."""


class DoubleFreeError(InvalidFreeError):
    """Freeing a pointer that is already free."""


class OutOfMemoryError(PyflowError, MemoryError):
    """An allocation cannot be satisfied even after emptying the cache.

    Attributes: ``request`` (bytes asked for), ``device`` (a string such as
    ``"cuda:0"``) and ``stats`` (the allocator's statistics when it failed).
    """

    def __init__(self, message: str, *, request: int = 0, device: str = "", stats=None):
        super().__init__(message)
        self.request = request
        self.device = device
        self.stats = stats


# --- the virtual machine -------------------------------------------------------


class VMHangError(PyflowError, RuntimeError):
    """The VM made no progress for the hang timeout and nothing was running; names the
    blocked instructions, what each waits for and for how long.  Also raised at once for a
    wait that can never end (a VM thread waiting for the VM itself)."""


class VMIdleWaitError(PyflowError, RuntimeError):
    """A wait on the VM made no progress for the hang timeout while the VM had nothing to do: no
    instruction blocked, none running.  Not a hang of the VM (``VMHangError`` always names what is
    blocked): what the wait is for is not the VM's work."""


class VMThreadError(PyflowError, RuntimeError):
    """A VM thread (the scheduler or a worker) hit an unexpected error.

    Raised at the next call into the VM; ``thread`` names the thread and
    ``__cause__`` is the error.  The thread itself keeps running.
    """

    def __init__(self, message: str, *, thread: str = ""):
        super().__init__(message)
        self.thread = thread


class SlowInstructionWarning(UserWarning):
    """An instruction has been running for longer than the hang timeout.

    Not an error: work that is running is never reported as a hang, and the VM
    keeps waiting (Ctrl-C interrupts the wait).
    """


class OpError(PyflowError, RuntimeError):
    """An op (its kernel, a copy, a callback) failed on a VM worker.

    Raised when a tensor the op wrote (or anything computed from it) is read, and
    by ``flow.sync()`` in the thread that issued the op; ``op`` names the op, the
    message the Python line that issued it, and ``__cause__`` is the original
    exception.  ``others``: further failures that the same ``flow.sync()`` reports.
    """

    def __init__(self, message: str, *, op: str = ""):
        super().__init__(message)
        self.op = op
        self.failure = None
        self.others: list = []


# --- autograd -------------------------------------------------------------------------


class AutogradError(PyflowError, RuntimeError):
    """Backward cannot run: a tensor without grad_fn, a graph already freed, a saved tensor changed
    in place, an in-place op on a leaf that requires grad, an op without a backward rule."""


class OptimizerError(PyflowError, ValueError):
    """Bad input to an optimizer or a scheduler (``pyflow/optim/``): a parameter that is not a trainable
    leaf, one listed twice, a negative learning rate, a state dict that does not fit."""


# --- nn (pyflow/nn/) ----------------------------------------------------------------


class ArgumentValueError(PyflowError, ValueError):
    """A layer or loss given a value it does not accept: ``p`` outside [0, 1], an unknown reduction,
    ``groups=2`` for a Conv2d, an input of the wrong rank."""


class StateDictError(PyflowError, KeyError, ValueError):
    """A state dict that does not fit: missing or unexpected keys, wrong shapes, values that are not numbers.

    Raised by ``nn.Module.load_state_dict`` and by the models' ``load_state_dict`` (``pyflow/models/``).
    A KeyError, as a missing or unexpected key is a failed lookup, and a ValueError, as a wrong shape
    is a bad value: ``except KeyError`` and ``except ValueError`` both catch it (as ``AxisError`` above
    is both an IndexError and a ValueError, like numpy's).

    >>> issubclass(StateDictError, KeyError) and issubclass(StateDictError, ValueError)
    True
    >>> str(StateDictError("missing keys ['bias']"))   # unquoted, unlike a plain KeyError
    "missing keys ['bias']"
    """

    def __str__(self) -> str:   # KeyError would print the message in quotes
        return str(self.args[0]) if self.args else ""


# --- flow.save / flow.load (pyflow/serialization/) ------------------------------------


class SerializationError(PyflowError, RuntimeError):
    """``flow.load`` cannot read a file (truncated, corrupt, not written by ``flow.save``, a pickle refused
    under ``weights_only=True``) or ``flow.save`` cannot write an object; names the file and, inside the
    object, where (``obj['model']['weight']``).  ``path``: the file (or a description of the buffer)."""

    def __init__(self, message: str, *, path: str = ""):
        super().__init__(message)
        self.path = path


# --- nn.Graph and the compiler (pyflow/graph/, pyflow/compiler/) --------------------


class GraphError(PyflowError, RuntimeError):
    """``nn.Graph.build`` did something a traced graph cannot hold (read a value with ``.numpy()`` or
    ``if x.sum() > 0``, returned a non-tensor, called a graph inside a graph, ``backward()`` of a
    non-scalar); the message names the Python line."""


class CompileError(PyflowError, RuntimeError):
    """The compiler cannot turn a Job into a Plan: no SBP signature for a placement, a link between
    pipeline stages that does not go through ``to_global``, a cycle; names the ops and Python lines."""


# --- ranks and collectives (pyflow/distributed/) --------------------------------


class DistributedError(PyflowError, RuntimeError):
    """Something went wrong between ranks."""


class RankError(DistributedError):
    """A rank's function raised; ``rank`` says which, ``__cause__`` is its exception."""

    def __init__(self, message: str, *, rank: int = -1):
        super().__init__(message)
        self.rank = rank


class RankAbortedError(DistributedError):
    """Another rank failed (or the world was stopped) while this rank waited for it."""


class CollectiveMismatchError(DistributedError):
    """The ranks of one collective reached different collectives (divergent code): lists each
    rank's op, shape, dtype, SBP and Python line."""


class CollectiveTimeoutError(DistributedError):
    """A collective waited longer than the watchdog allows: names the ranks that never arrived,
    where the waiting ones are, and where the missing ones were last seen."""


# --- kernel launches (the simulator and the GPU wrapper) ---------------------


class LaunchConfigError(PyflowError, ValueError):
    """A kernel launch configuration real CUDA would reject (0 blocks, >1024 threads...)."""


class CooperativeLaunchTooLargeError(LaunchConfigError):
    """A grid that uses grid sync has more blocks than can be co-resident."""


class KernelError(PyflowError, RuntimeError):
    """An exception raised by one CUDA thread of a simulated kernel.

    ``thread_idx`` and ``block_idx`` say which thread; ``__cause__`` is the
    original exception with its traceback into the kernel source.
    """

    def __init__(self, message: str, *, kernel: str = "", thread_idx=None, block_idx=None):
        super().__init__(message)
        self.kernel = kernel
        self.thread_idx = thread_idx
        self.block_idx = block_idx


class DeadlockError(PyflowError, RuntimeError):
    """Simulated threads wait at barriers that can never complete."""


class DivergentBarrierError(DeadlockError):
    """Threads of one block wait at different ``syncthreads`` call sites."""


class GridSyncExitError(DeadlockError):
    """A thread exited while others wait (or will wait) at a grid barrier.

    On a GPU this hangs: a grid barrier needs every thread of the grid.
    """


class KernelHangError(DeadlockError):
    """A simulated kernel made no progress for the configured timeout."""


# --- Cocktailer (seed 001) -----------------------------------------------------------


class CocktailerError(PyflowError, RuntimeError):
    """A Cocktailer program failed while running (on either executor)."""


class StackOverflowError(CocktailerError):
    """A recursive function went deeper than its stack has frames (``stack_depth``)."""


class IterationLimitError(CocktailerError):
    """A while loop ran more iterations than its ``max_iters``."""


# --- the actor runtime (seed 003) ----------------------------------------------------------


class RuntimeHangError(PyflowError, RuntimeError):
    """The actor runtime made no progress for its hang timeout (``PYFLOW_HANG_TIMEOUT``) with calls in
    flight and no device work the VM has reached, or (deterministic mode) ran out of messages before a call
    finished: names every waiting actor and the regst desc it waits for."""
