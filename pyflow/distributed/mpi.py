"""How a process becomes a rank: pyflow in a process that MPI started (OneFlow's process context, seed 000 §3).

OneFlow runs one process per device.  Each learns its place from its launcher's
environment, joins the others, and everything the process owns (its VM,
streams, allocator caches) hangs off its rank.  pyflow's rule "a rank behaves as
a process" is then simply true: when pyflow is imported in a process of an MPI
job, that process *is* its MPI rank.

* **Detection** (``launched_by_mpi``): ``PMI_RANK``/``PMI_SIZE`` (MPICH's
  ``mpiexec``, hence ``python -m pyflow.distributed.launch`` too),
  ``OMPI_COMM_WORLD_RANK``/``SIZE`` (Open MPI), or ``RANK`` + ``WORLD_SIZE``
  (OneFlow's names, set by some other launcher: MPI must then agree).  Only a
  world of two or more is joined, and not by a process that a rank started
  (it inherits those variables).  ``PYFLOW_MPI=0`` turns this off,
  ``PYFLOW_MPI=1`` joins whatever ``mpi4py`` finds; ``init_mpi()`` does it
  from Python.
* **Joining** (``init_mpi``): ``MPI_Init_thread`` (mpi4py is imported only
  now), the local rank (the launcher's, else the ranks sharing this machine),
  a ``CommNet`` thread (``mpi_commnet.py``) and an ``MPITransport`` (``mpi_transport.py``), and
  ``env.set_process_context``: every thread of the process that is not an
  in-process rank thread now sees this rank.  ``RANK``, ``WORLD_SIZE`` and
  ``LOCAL_RANK`` are set in ``os.environ`` for scripts that read them.
* **``flow.distributed.run(fn, world_size)``** in such a process runs ``fn``
  once, here, as this rank (``world_size`` must be the MPI world's size), then
  gathers every rank's result: each process gets ``[result of rank 0, ...]``,
  as the in-process ``run`` returns.  So one script runs unchanged as threads
  (``python script.py``) or as processes (``mpiexec -n 2 python script.py``).
* **Faults.**  A rank that raises (in ``run``'s ``fn``, or uncaught in its main
  thread: ``sys.excepthook``) aborts the world: every rank's waits end with an
  error naming it.  A process that dies cannot say so.  MPICH's ``mpiexec``
  kills the other processes at once when one dies of a signal (its banner
  shows a PID, not always the dead one's), and when one ends with an exit
  status unless started with ``-disable-auto-cleanup``; then it sends the
  others ``SIGUSR1`` instead, and each asks every rank "where are you?" and
  names the ones that do not answer in 2 s as dead.  ``launch`` runs with
  that flag and puts each rank under a supervisor that turns a death by a
  signal into an exit status (``launch.py``), so the dead rank is always named.
  Under a plain ``mpiexec`` each rank starts a sentinel that holds what MPICH
  watches (``mpi_sentinel.py``), and every rank watches the processes of its
  machine's other ranks (``peers``, gathered here; ``mpi_watchdog.py``): a
  rank that exits without pyflow is named before MPICH ends the job.  Every
  rank unlinks MPICH's shared-memory segment once all have mapped it, so no
  ending of a job leaves it in ``/dev/shm``.
  Open MPI's ``mpiexec`` has no such mode: when a process dies or exits with
  a non-zero status it names it (so does ``launch``'s supervisor) and ends the
  others itself, before they can name it (README, "What differs on Open MPI").
* **Exit.**  A clean exit says goodbye to every rank (with its counts of
  collectives and sends, so a rank still waiting for more fails at once), waits
  for theirs, and finalizes MPI.  After an abort, MPI cannot be finalized
  (requests to the failed rank stay pending): the process waits up to 2 s for
  the others' goodbyes, so they print their errors first, then ends with
  ``os._exit(1)``; a process whose main thread does not end within 10 s of an
  abort is ended by its ``pyflow-abort-exit-r<rank>`` thread.  No process is
  left behind.
"""

from __future__ import annotations

import atexit
import os
import signal
import socket
import sys
import threading
import time

from pyflow import env, vm
from pyflow.distributed import mpi_sentinel
from pyflow.distributed.transport import CollectiveDesc
from pyflow.errors import DistributedError, RankAbortedError, RankError

__all__ = ["launched_by_mpi", "init_mpi", "init_if_launched", "run_this_rank", "process_transport"]

_ABORT_GRACE_SECONDS = 2.0   # an aborted process waits this long for the others' goodbyes
_ABORT_EXIT_SECONDS = 10.0   # ... and is ended this long after an abort if its main thread is still busy
_CENSUS_SECONDS = 2.0        # after SIGUSR1, the ranks that do not answer in this long are dead

_ENV_PAIRS = (("PMI_RANK", "PMI_SIZE"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"), ("RANK", "WORLD_SIZE"))


def launched_by_mpi() -> tuple | None:
    """``(rank, world size, variable)`` if the environment says this process is a rank of a job, else None."""
    for rank_var, size_var in _ENV_PAIRS:
        if rank_var in os.environ and size_var in os.environ:
            try:
                return int(os.environ[rank_var]), int(os.environ[size_var]), rank_var
            except ValueError:
                raise DistributedError(f"{rank_var}={os.environ[rank_var]!r} and {size_var}="
                                       f"{os.environ[size_var]!r} must be integers") from None
    return None


def process_transport():
    """This process's ``MPITransport``, or None when the process is not an MPI rank."""
    transport = env.process_context().transport
    return transport if getattr(transport, "spans_processes", False) else None


def init_if_launched() -> env.RankContext | None:
    """Join the MPI world if the environment says so (``PYFLOW_MPI``: auto, 0, 1); called at ``import pyflow``."""
    mode = os.environ.get("PYFLOW_MPI", "auto").strip().lower()
    if mode in ("0", "off", "no") or process_transport() is not None:
        return None
    if os.environ.get("PYFLOW_MPI_RANK_PID", str(os.getpid())) != str(os.getpid()):
        return None   # a process a rank started (it inherited PMI_RANK...): not that rank, a world of one
    found = launched_by_mpi()
    if mode in ("1", "on", "yes") or (found is not None and found[1] > 1):
        return init_mpi(expect=found)
    return None


def init_mpi(expect: tuple | None = None, timeout: float | None = None) -> env.RankContext:
    """Make this process its MPI rank (``MPI_Init_thread`` if needed); the new process context.

    ``timeout``: seconds a collective may wait (default ``PYFLOW_COLLECTIVE_TIMEOUT``, 60).
    """
    if process_transport() is not None:
        return env.process_context()
    try:
        import mpi4py
    except ImportError:
        raise DistributedError("this process was started as an MPI rank, but mpi4py is not installed: "
                               "pip install -e '.[dist]' (or PYFLOW_MPI=0 to run as a world of one)") from None
    mpi4py.rc.finalize = False          # pyflow finalizes (or not, after an abort) in its exit handler
    mpi4py.rc.thread_level = "multiple"
    if mpi_sentinel.hydra_without_supervisor():
        mpi_sentinel.start()   # a plain MPICH mpiexec: this rank's death waits until the others named it
    from mpi4py import MPI

    from pyflow.distributed.mpi_commnet import CommNet
    from pyflow.distributed.mpi_transport import MPITransport

    if MPI.Query_thread() < MPI.THREAD_SERIALIZED:
        raise DistributedError("MPI was initialized before pyflow with a thread level below MPI_THREAD_SERIALIZED; "
                               "pyflow's comm-net thread makes the MPI calls")
    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    if expect is not None and (expect[0], expect[1]) != (rank, size):
        raise DistributedError(f"the environment says rank {expect[0]} of {expect[1]} ({expect[2]}), but MPI says "
                               f"rank {rank} of {size}: start the processes with mpiexec or "
                               f"python -m pyflow.distributed.launch")
    local_rank = _local_rank(world, MPI)
    seconds = float(os.environ.get("PYFLOW_COLLECTIVE_TIMEOUT", "60")) if timeout is None else timeout
    peers = dict(enumerate(world.allgather((socket.gethostname(), os.getpid()))))   # for the peer watch
    _unlink_shared_memory()   # every rank of this machine mapped it (the allgather came after their MPI_Init)
    net = CommNet(world, seconds, peers)
    ctx = env.RankContext(rank=rank, world_size=size, local_rank=local_rank, transport=MPITransport(net))
    env.set_process_context(ctx)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(size), LOCAL_RANK=str(local_rank),
                      PYFLOW_MPI_RANK_PID=str(os.getpid()))
    _record_for_launch(rank)
    _install_fault_hooks(net)
    threading.Thread(target=_exit_after_abort, args=(net,), name=f"pyflow-abort-exit-r{rank}", daemon=True).start()
    atexit.register(_at_exit, net)
    return ctx


def _local_rank(world, MPI) -> int:
    """This process's index on its machine: the launcher's (MPICH, Open MPI, OneFlow's name), else MPI's own
    (the ranks that share memory with this one)."""
    for name in ("MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", "LOCAL_RANK"):
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    shared = world.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return shared.Get_rank()
    finally:
        shared.Free()


def _record_for_launch(rank: int, suffix: str = "pid", text: str = "") -> None:
    """Leave ``rank-<r>.pid`` (at start) and ``rank-<r>.exit`` (when pyflow ends the process) in
    ``PYFLOW_LAUNCH_DIR``: a rank with a pid and no exit record died without a word (``launch`` names it)."""
    folder = os.environ.get("PYFLOW_LAUNCH_DIR")
    if folder and os.path.isdir(folder):
        with open(os.path.join(folder, f"rank-{rank}.{suffix}"), "w") as out:
            out.write(text or f"{os.getpid()} {socket.gethostname()}\n")


# --- flow.distributed.run in an MPI world --------------------------------------------------------------------------


def _secondary(error: BaseException | None) -> bool:
    while error is not None:
        if isinstance(error, RankAbortedError):
            return True
        error = error.__cause__
    return False


def run_this_rank(fn, world_size: int, args=(), timeout: float | None = None) -> list:
    """``flow.distributed.run`` in a process that is an MPI rank: ``fn(*args)`` here, then every rank's result."""
    from pyflow.vm.failure import issue_site

    ctx = env.process_context()
    transport = ctx.transport
    if world_size != ctx.world_size:
        raise DistributedError(f"distributed.run(fn, world_size={world_size}) in an MPI job of {ctx.world_size} "
                               f"processes: each process is one rank, so world_size must be {ctx.world_size} (start "
                               f"{world_size} processes: mpiexec -n {world_size} ...)")
    site = issue_site()
    previous = transport.timeout
    if timeout is not None:
        transport.timeout = timeout
    try:
        try:
            result = fn(*args)
            vm.sync()   # the rank's work is done, and its failed ops raise here
        except BaseException as error:
            if not _secondary(error):
                transport.net.abort(f"{type(error).__name__}: {error}", error)
            raise _rank_error(transport.net, error) from _first_error(transport.net, error)
        group = tuple(range(ctx.world_size))
        desc = CollectiveDesc("distributed.run: gather the results (the rank returned from fn)", site=site)
        try:
            return transport.exchange(group, transport.next_seq(group), desc, result)
        except BaseException as error:
            raise _rank_error(transport.net, error) from _first_error(transport.net, error)
    finally:
        transport.timeout = previous


def _rank_error(net, error: BaseException) -> RankError:
    """``RankError`` naming the rank that failed first (as this rank heard it; this rank if none did)."""
    failed, text = net.aborted or (net.rank, f"{type(error).__name__}: {error}")
    return RankError(f"rank {failed} of {net.world_size} failed: {text}", rank=failed)


def _first_error(net, error: BaseException) -> BaseException:
    """The failed rank's own exception (sent along with its abort), else this rank's."""
    if net.aborted is not None and net.aborted[0] != net.rank and net.aborted_error is not None:
        return net.aborted_error
    return error


# --- faults and exit -------------------------------------------------------------------------------------------------


def _install_fault_hooks(net) -> None:
    previous_hook = sys.excepthook

    def excepthook(kind, value, tb):
        if net.aborted is None and not _secondary(value):
            net.abort(f"{kind.__name__}: {value} (uncaught in its main thread)", value)
        previous_hook(kind, value, tb)

    sys.excepthook = excepthook
    if threading.current_thread() is threading.main_thread() and \
            signal.getsignal(signal.SIGUSR1) in (signal.SIG_DFL, None):
        # MPICH's mpiexec -disable-auto-cleanup: SIGUSR1 = "a process of this job failed"
        signal.signal(signal.SIGUSR1, lambda signum, frame: net.census(_CENSUS_SECONDS))


def _exit_after_abort(net) -> None:
    """After an abort, end the process if its main thread has not ended it within ``_ABORT_EXIT_SECONDS``."""
    while net.aborted is None:
        if net.closed:
            return
        time.sleep(0.1)
    deadline = time.monotonic() + _ABORT_EXIT_SECONDS
    while time.monotonic() < deadline:
        if net.closed:
            return
        time.sleep(0.1)
    frame = sys._current_frames().get(threading.main_thread().ident)
    from pyflow.distributed.mpi_watchdog import user_line

    print(f"pyflow: rank {net.rank}: the job was aborted ({net.aborted[1].splitlines()[0]}) "
          f"{_ABORT_EXIT_SECONDS:g} s ago and the main thread is still busy at {user_line(frame)}: exiting",
          file=sys.stderr, flush=True)
    _flush_and_exit(1, net.rank)


def shared_memory_files() -> list:
    """The MPI shared-memory segments this process maps (MPICH's ``/dev/shm/mpich_shm_*``; Linux)."""
    try:
        with open("/proc/self/maps") as maps:
            found = {line.split(None, 5)[5].strip() for line in maps if "/dev/shm/mpich_shm_" in line}
    except (OSError, IndexError):
        return []
    return sorted(path for path in found if not path.endswith("(deleted)"))


def _unlink_shared_memory() -> None:
    """Unlink the MPI segments this process maps.  MPICH unlinks them only in ``MPI_Finalize``, which a job that
    is aborted or killed never reaches: each would stay in ``/dev/shm`` (2-3 MB per job and machine) until
    reboot.  Safe once every rank of the machine mapped them: the ranks keep their memory, and ``MPI_Finalize``
    does not mind that the file is gone.  Done at start-up, and again on an aborted exit (a segment made later)."""
    for path in shared_memory_files():
        try:
            os.unlink(path)
        except OSError:
            pass   # another rank of this machine unlinked it first


def _flush_and_exit(status: int, rank: int) -> None:
    _record_for_launch(rank, "exit", f"{status}\n")
    mpi_sentinel.release()
    if status != 0:
        _unlink_shared_memory()   # no MPI_Finalize after an abort
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed stream: nothing to flush
            pass
    os._exit(status)


def _at_exit(net) -> None:
    """Drain the VM, say goodbye, and finalize MPI; or, after an abort, exit with status 1 without finalizing."""
    if net.aborted is None:
        try:
            vm.shutdown(at_exit=True)   # its collectives still need the comm-net thread
        except BaseException as error:  # noqa: BLE001 - reported, and the job is aborted
            net.abort(f"{type(error).__name__}: {error} (while rank {net.rank} shut down its VM)")
    if net.close(_ABORT_GRACE_SECONDS):
        from mpi4py import MPI

        _record_for_launch(net.rank, "exit", "0\n")
        MPI.Finalize()
        mpi_sentinel.release()
        if threading.current_thread() is threading.main_thread():
            # done: a late "a process ended" from mpiexec (-disable-auto-cleanup) must not kill this one while
            # Python finalizes (it resets its own handlers to the default, which is to terminate)
            signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        return
    rank, text = net.aborted or (net.rank, "operations were still in flight at exit")
    if rank != net.rank:
        print(f"pyflow: rank {net.rank} exits with status 1: rank {rank} failed: {text.splitlines()[0]}",
              file=sys.stderr)
    _flush_and_exit(1, net.rank)
