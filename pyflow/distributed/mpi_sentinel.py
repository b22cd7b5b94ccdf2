"""The sentinel: under a plain MPICH ``mpiexec``, the rank's death waits until the other ranks named it.

MPICH's process manager (Hydra) learns that a process ended when its
connection to it (``PMI_FD``) and its output pipes close; it then kills every
other process of the job at once (``SIGKILL``: nothing can run in them), with
no word (``os._exit(3)``) or a banner that shows a PID but no rank (a signal).
``python -m pyflow.distributed.launch`` avoids this with a supervisor per rank
(``launch.py``) and ``-disable-auto-cleanup``; a plain ``mpiexec -n 2 python
train.py`` has neither.  So each rank of such a job starts, before it joins MPI,
a small process that inherits those descriptors and holds them: the
*sentinel* (this file run as a script; it imports nothing from pyflow).

* A rank that ends through pyflow (a clean exit, or ``os._exit(1)`` after an
  abort) tells its sentinel first (``release``), which then exits at once.
* A rank that ends otherwise (``os._exit``, a crash) leaves its sentinel
  holding the descriptors: Hydra does not see the end yet (it may reap the
  process, but acts only once they close).  The sentinel reads its exit status
  in ``/proc/<pid>/stat`` while it is a zombie (``how_it_ended``), names the
  rank on stderr (``pyflow: rank 1 (pid 4242 on node0) exited with status 3
  without pyflow's exit handler (os._exit, or a crash)``), and the other ranks
  of its machine, which watch their peers' processes (``mpi_watchdog.py``),
  raise an error naming it and exit.  ``_GRACE_SECONDS`` later the sentinel
  exits, and Hydra ends the job as before, with the dead rank's own status.
* A rank killed by a signal cannot be helped so: Hydra reaps it at once and,
  seeing a signal, kills every process at once (``pmip.c``: ``WIFSIGNALED`` ->
  ``PMIP_bcast_signal(SIGKILL)``, with or without ``-disable-auto-cleanup``).
  Only its sentinel's line names the rank then; ``launch`` keeps the rank one
  process further from Hydra, so there the others name it too.

>>> how_it_ended(os.getpid()) is None   # a process that runs has not ended
True
>>> describe(3 << 8), describe(9)
("exited with status 3 without pyflow's exit handler (os._exit, or a crash)", 'was killed by signal 9 (SIGKILL)')
"""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import time

__all__ = ["start", "release", "how_it_ended", "describe"]

_GRACE_SECONDS = 3.0   # after its rank died, the sentinel holds the job this long: the other ranks name it
_POLL_SECONDS = 0.1    # how often the sentinel looks whether its rank still runs

REAPED = "ended without pyflow's exit handler (os._exit, a signal or a crash)"

_released: list = []   # the write end of the pipe to this process's sentinel, while there is one


def hydra_without_supervisor() -> bool:
    """Whether this process was started by MPICH's ``mpiexec`` (Hydra: ``PMI_FD`` or ``PMI_PORT``) directly,
    not under ``launch``'s supervisor (``PYFLOW_SUPERVISED``), which holds the descriptors itself."""
    hydra = "PMI_FD" in os.environ or "PMI_PORT" in os.environ
    return hydra and os.environ.get("PYFLOW_SUPERVISED") != "1"


def start() -> None:
    """Start this rank's sentinel (before MPI is initialized: it holds only what Hydra gave the rank)."""
    read_end, write_end = os.pipe()
    os.set_inheritable(read_end, True)   # and every descriptor Hydra left open: close_fds=False
    subprocess.Popen([sys.executable, "-I", "-S", os.path.abspath(__file__), str(read_end),
                      os.environ.get("PMI_RANK", "?")], close_fds=False)
    os.close(read_end)
    _released.append(write_end)


def release() -> None:
    """This rank ends through pyflow: its sentinel exits at once (it need not name anyone)."""
    while _released:
        fd = _released.pop()
        try:
            os.write(fd, b"x")
            os.close(fd)
        except OSError:
            pass   # the sentinel is gone already


def describe(status: int) -> str:
    """How a process ended, from its ``waitpid`` status word."""
    if status & 0x7F:
        number = status & 0x7F
        name = signal.Signals(number).name if number in signal.valid_signals() else "?"
        return f"was killed by signal {number} ({name})"
    return f"exited with status {status >> 8 & 0xFF} without pyflow's exit handler (os._exit, or a crash)"


def how_it_ended(pid: int) -> str | None:
    """None while process ``pid`` (of this machine) runs; else how it ended (``describe``), as long as its parent
    has not reaped it (``REAPED`` then: its status is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return REAPED
    if fields[0] not in ("Z", "X"):
        return None
    return describe(int(fields[49])) if len(fields) > 49 else REAPED   # field 52: exit_code (Linux >= 3.5)


def _watch(read_end: int, rank: str) -> int:
    """The sentinel's life: wait until its rank ends; if pyflow did not say so first, name it and hold on."""
    for name in ("SIGINT", "SIGUSR1"):   # Ctrl-C and Hydra's "a process died" are for the rank
        signal.signal(getattr(signal, name), signal.SIG_IGN)
    parent = os.getppid()
    while os.getppid() == parent:
        if select.select([read_end], [], [], _POLL_SECONDS)[0]:
            if os.read(read_end, 1):
                return 0   # released: the rank ends through pyflow
            break          # the pipe closed: the rank ended without a word
    how = how_it_ended(parent) or REAPED
    print(f"pyflow: rank {rank} (pid {parent} on {socket.gethostname()}) {how}", file=sys.stderr, flush=True)
    time.sleep(_GRACE_SECONDS)
    return 0


if __name__ == "__main__":
    sys.exit(_watch(int(sys.argv[1]), sys.argv[2]))
