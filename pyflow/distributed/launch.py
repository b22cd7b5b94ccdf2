"""``python -m pyflow.distributed.launch``: one script as the N processes of an MPI job (OneFlow's launcher).

OneFlow starts a multi-process job with ``python -m oneflow.distributed.launch
--nproc_per_node N script.py [args]``; each process learns its place from the
environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``,
``MASTER_PORT``).  pyflow's launcher takes the same flags and runs, with MPICH::

    mpiexec -disable-auto-cleanup -n N*nnodes [-f HOSTFILE -ppn N] \\
        python .../pyflow/distributed/launch.py --rank-main script.py [args]

and with Open MPI 4 or 5 (``mpiexec --version`` says which; ``mpi_flavor``)::

    mpiexec -n N*nnodes --map-by ppr:N:node:OVERSUBSCRIBE --bind-to none [--hostfile HOSTFILE] \\
        python .../pyflow/distributed/launch.py --rank-main script.py [args]

(``mpiexec`` from the ``dist`` extra: ``pip install -e ".[dist]"``.)  MPI's
process manager plays OneFlow's master: the ranks meet through it, so
``MASTER_ADDR``/``MASTER_PORT`` are only passed on, for scripts that read them.
Several machines: list them in a hostfile (MPICH's format: ``host:slots`` per
line; Open MPI's: ``host slots=N``) and pass ``--hostfile``; ``mpiexec`` starts
every machine's processes from here.  Like OneFlow's launcher, and MPICH's
``mpiexec``, Open MPI's then starts N processes per machine whatever its number
of cores, and leaves them unbound (its own defaults refuse more processes than
cores and bind each to a core, which pyflow's threads would share).
``--mpiexec_args`` passes more options to ``mpiexec``; ``--dry_run`` prints the
command.  N ranks on a machine of C cores get C/N BLAS threads each
(``OPENBLAS_NUM_THREADS``, ``OMP_NUM_THREADS``, ``MKL_NUM_THREADS``, unless set:
``blas_environment``; ``torchrun`` sets ``OMP_NUM_THREADS=1`` so): numpy's BLAS
takes one thread per core, so N ranks would run N*C threads on C cores.

Each of mpiexec's processes is a small **supervisor** (this file run as a
script: it imports nothing from pyflow) that starts the rank itself, ``python
-m pyflow.distributed.launch --rank-process script.py``: that process imports
pyflow, which makes it its MPI rank and sets ``RANK``, ``WORLD_SIZE`` and
``LOCAL_RANK`` (``pyflow/distributed/mpi.py``), then runs the script as
``__main__``.  The supervisor is there for faults.  MPICH's ``mpiexec`` kills
every process at once when one dies of a signal, so nobody could say which
rank died; a process that ends with an exit status instead is reported to the
others (``SIGUSR1``, with ``-disable-auto-cleanup``), and each names the dead
rank and exits.  So the supervisor turns its rank's death by a signal into an
exit status, and names the rank: ``rank 1 (pid 4242 on node0) was killed by
signal 9 (SIGKILL)``.  The exit status is ``mpiexec``'s.  Open MPI's
``mpiexec`` has no such mode (``--enable-recovery`` lets the others go on but
tells them nothing): when a process ends with a non-zero status it names it
(``[prterun-...@1,1]``: job 1, rank 1, and its exit code) and ends every other
one itself (SIGCONT, SIGTERM, then SIGKILL, to each process group: supervisor
and rank).  There the supervisor's line is the one that says how the rank
died, and the other ranks are ended before they can name it.

``local_job`` is a plain ``mpiexec -n N`` on this machine, with Open MPI's flags
and, as root, its two variables that allow root: the tests' and the benchmarks'
MPI jobs (``tests/mpi_helpers.py``, ``benchmarks/bench_collectives.py``).

>>> print(" ".join(command(parse(["--nproc_per_node", "2", "train.py", "--lr", "0.1"]), mpiexec="mpiexec",
...                        python="python", supervisor="launch.py", flavor="mpich")))
mpiexec -disable-auto-cleanup -n 2 python launch.py --rank-main train.py --lr 0.1
>>> print(" ".join(command(parse(["--nproc_per_node", "2", "train.py"]), mpiexec="mpiexec",
...                        python="python", supervisor="launch.py", flavor="openmpi")))
mpiexec -n 2 --map-by ppr:2:node:OVERSUBSCRIBE --bind-to none python launch.py --rank-main train.py
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__" and not __package__:   # the supervisor, run as a file: keep pyflow's folder off the path
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]

import argparse  # noqa: E402
import runpy  # noqa: E402
import shlex  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402

__all__ = ["parse", "command", "main", "mpi_flavor", "local_job", "job_environment", "openmpi_flags",
           "blas_environment"]

BLAS_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def parse(argv: list) -> argparse.Namespace:
    """The launcher's flags (OneFlow's, plus --hostfile, --mpiexec, --mpiexec_args, --dry_run)."""
    parser = argparse.ArgumentParser(prog="python -m pyflow.distributed.launch",
                                     description="Run a script as the ranks of an MPI job (pyflow's "
                                                 "oneflow.distributed.launch).")
    parser.add_argument("--nproc_per_node", type=int, default=1, help="processes per machine (default 1)")
    parser.add_argument("--nnodes", type=int, default=1, help="machines (more than 1 needs --hostfile)")
    parser.add_argument("--node_rank", type=int, default=0,
                        help="OneFlow's per-machine launch; with MPI, launch once, from node 0")
    parser.add_argument("--master_addr", default="127.0.0.1", help="passed on as MASTER_ADDR")
    parser.add_argument("--master_port", type=int, default=29500, help="passed on as MASTER_PORT")
    parser.add_argument("--hostfile", help="hostfile for several machines (MPICH: host:slots per line; "
                                           "Open MPI: host slots=N)")
    parser.add_argument("--mpiexec", help="the mpiexec to run (default: the one next to this Python, then PATH)")
    parser.add_argument("--mpiexec_args", default="", help="more options for mpiexec, as one string")
    parser.add_argument("--dry_run", action="store_true", help="print the mpiexec command and exit")
    parser.add_argument("--rank-main", dest="role", action="store_const", const="supervisor", help=argparse.SUPPRESS)
    parser.add_argument("--rank-process", dest="role", action="store_const", const="rank", help=argparse.SUPPRESS)
    parser.add_argument("script", help="the training script")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, help="its arguments")
    args = parser.parse_args(argv)
    if args.role:
        return args
    if args.nproc_per_node < 1 or args.nnodes < 1:
        parser.error("--nproc_per_node and --nnodes must be >= 1")
    if args.node_rank != 0:
        parser.error("--node_rank: with MPI, run launch once, on node 0; mpiexec starts the other machines' "
                     "processes (list them with --hostfile)")
    if args.nnodes > 1 and not args.hostfile:
        parser.error("--nnodes > 1 needs --hostfile (the machines mpiexec starts the processes on)")
    return args


def find_mpiexec(explicit: str | None = None) -> str:
    """The mpiexec to run: ``explicit``, else the one next to this Python (the mpich wheel's), else PATH."""
    if explicit:
        return explicit
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    found = here if os.access(here, os.X_OK) else shutil.which("mpiexec")
    if found is None:
        raise SystemExit("pyflow.distributed.launch: no mpiexec found; install the dist extra: "
                         "pip install -e '.[dist]'")
    return found


# What ``mpiexec --version`` prints: Open MPI 5 "mpiexec (Open MPI) 5.0.x", Open MPI 4 "mpiexec (OpenRTE)
# 4.1.x" (its project name is "Open MPI" only when called as mpirun), both with a "Report bugs to
# ...open-mpi.org..." line; MPICH's Hydra "HYDRA build details: ...".
_OPENMPI_SAYS = ("Open MPI", "OpenRTE", "open-mpi.org")


def mpi_flavor(mpiexec: str) -> str:
    """Which MPI ``mpiexec`` belongs to, from its ``--version``: ``"openmpi"`` (4 or 5), else ``"mpich"``
    (MPICH's Hydra, also Intel MPI's)."""
    try:
        done = subprocess.run([mpiexec, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "mpich"
    said = done.stdout + done.stderr
    return "openmpi" if any(mark in said for mark in _OPENMPI_SAYS) else "mpich"


def openmpi_flags(per_node: int) -> list:
    """What Open MPI's ``mpiexec`` needs to do what MPICH's does by default: ``per_node`` processes on each
    machine whatever its number of cores, none bound to a core (flags of Open MPI 4 and 5)."""
    return ["--map-by", f"ppr:{per_node}:node:OVERSUBSCRIBE", "--bind-to", "none"]


def job_environment(flavor: str, environ: dict | None = None) -> dict:
    """The environment to run ``mpiexec`` in: ``environ`` (default ``os.environ``), and for Open MPI run as
    root (a container) ``OMPI_ALLOW_RUN_AS_ROOT=1`` and ``OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1``: it refuses root
    otherwise (values already set are kept).  For the tests' and the benchmarks' jobs; a user of ``launch``
    allows root themself."""
    environment = dict(os.environ if environ is None else environ)
    if flavor == "openmpi" and os.geteuid() == 0:
        environment.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        environment.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    return environment


def blas_environment(per_node: int, environ: dict | None = None, cores: int | None = None) -> dict:
    """The BLAS thread counts for ``per_node`` ranks on a machine of ``cores`` cores (default: the ones this
    process may run on): ``cores // per_node`` (at least 1) in each of ``BLAS_VARIABLES`` that ``environ``
    (default ``os.environ``) does not set.  BLAS reads them once, when it loads (``import numpy``).

    >>> blas_environment(2, environ={}, cores=2)
    {'OPENBLAS_NUM_THREADS': '1', 'OMP_NUM_THREADS': '1', 'MKL_NUM_THREADS': '1'}
    >>> blas_environment(4, environ={"OMP_NUM_THREADS": "3"}, cores=16)
    {'OPENBLAS_NUM_THREADS': '4', 'MKL_NUM_THREADS': '4'}
    """
    environ = os.environ if environ is None else environ
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    each = str(max(1, cores // max(1, per_node)))
    return {name: each for name in BLAS_VARIABLES if name not in environ}


def local_job(nproc: int, argv: list, mpiexec: str | None = None, flavor: str | None = None,
              environ: dict | None = None) -> tuple:
    """``(command, environment)`` that run ``argv`` as ``nproc`` MPI processes on this machine with either
    MPI (the tests' and the benchmarks' jobs): ``mpiexec -n nproc argv``, for Open MPI with
    ``openmpi_flags``, in ``job_environment``.  ``flavor``: ``mpi_flavor``'s (asked if None).

    >>> local_job(2, ["python", "job.py"], mpiexec="mpiexec", flavor="mpich", environ={})
    (['mpiexec', '-n', '2', 'python', 'job.py'], {})
    >>> " ".join(local_job(2, ["python", "job.py"], mpiexec="mpiexec", flavor="openmpi", environ={})[0])
    'mpiexec -n 2 --map-by ppr:2:node:OVERSUBSCRIBE --bind-to none python job.py'
    """
    mpiexec = mpiexec or find_mpiexec()
    flavor = flavor or mpi_flavor(mpiexec)
    line = [mpiexec, "-n", str(nproc), *(openmpi_flags(nproc) if flavor == "openmpi" else [])]
    return line + list(argv), job_environment(flavor, environ)


def command(args: argparse.Namespace, mpiexec: str | None = None, python: str | None = None,
            supervisor: str | None = None, flavor: str | None = None) -> list:
    """The mpiexec command line that starts a supervisor per rank (``flavor``: that of ``mpi_flavor``)."""
    mpiexec = mpiexec or find_mpiexec(args.mpiexec)
    n, per_node = str(args.nproc_per_node * args.nnodes), args.nproc_per_node
    if (flavor or mpi_flavor(mpiexec)) == "openmpi":
        line = [mpiexec, "-n", n, *openmpi_flags(per_node)]
        line += ["--hostfile", args.hostfile] if args.hostfile else []
    else:
        line = [mpiexec, "-disable-auto-cleanup", "-n", n]
        line += ["-f", args.hostfile, "-ppn", str(per_node)] if args.hostfile else []
    line += shlex.split(args.mpiexec_args)
    return line + [python or sys.executable, supervisor or os.path.abspath(__file__), "--rank-main", args.script,
                   *args.script_args]


# --- in each of mpiexec's processes ---------------------------------------------------------------------------------


def _supervise(args: argparse.Namespace) -> int:
    """Start this rank's process; if it dies of a signal, say which rank it was and exit with a status."""
    rank = os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "?"))
    quiet = lambda signum, frame: None  # noqa: E731 - reset to the default in the child (exec)
    signal.signal(signal.SIGUSR1, quiet)   # MPICH's "a process died" is for the rank, not for its supervisor
    signal.signal(signal.SIGINT, quiet)    # Ctrl-C reaches the rank too (one process group): it decides
    child = subprocess.Popen([sys.executable, "-m", "pyflow.distributed.launch", "--rank-process", args.script,
                              *args.script_args], close_fds=False,   # the PMI connection is inherited
                             env=dict(os.environ, PYFLOW_SUPERVISED="1"))   # no sentinel: this is one
    status = child.wait()
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)   # stays ignored while this Python finalizes
    where = f"rank {rank} (pid {child.pid} on {socket.gethostname()})"
    if status < 0:
        name = signal.Signals(-status).name if -status in signal.valid_signals() else "?"
        print(f"pyflow.distributed.launch: {where} was killed by signal {-status} ({name})",
              file=sys.stderr, flush=True)
        return 128 - status
    folder = os.environ.get("PYFLOW_LAUNCH_DIR", "")
    if status != 0 and folder and not os.path.exists(os.path.join(folder, f"rank-{rank}.exit")):
        print(f"pyflow.distributed.launch: {where} exited with status {status} without pyflow's exit handler "
              f"(os._exit, or a crash)", file=sys.stderr, flush=True)
    return status


def _rank_process(args: argparse.Namespace) -> int:
    """Become the MPI rank, then run the script as ``__main__``."""
    from pyflow.distributed import mpi

    mpi.init_if_launched()   # join the MPI world: sets RANK, WORLD_SIZE, LOCAL_RANK (once: a second call returns)

    sys.argv = [args.script, *args.script_args]
    sys.path[0] = os.path.dirname(os.path.abspath(args.script))
    runpy.run_path(args.script, run_name="__main__")
    return 0


def main(argv: list | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    if args.role == "supervisor":
        return _supervise(args)
    if args.role == "rank":
        return _rank_process(args)
    line = command(args)
    if args.dry_run:
        print(" ".join(shlex.quote(part) for part in line))
        return 0
    given = os.environ.get("PYFLOW_LAUNCH_DIR")   # a caller that wants the ranks' records (the tests)
    run_folder = given if given and os.path.isdir(given) else tempfile.mkdtemp(prefix="pyflow-launch-")
    environment = dict(os.environ, MASTER_ADDR=args.master_addr, MASTER_PORT=str(args.master_port),
                       PYFLOW_LAUNCH_DIR=run_folder, **blas_environment(args.nproc_per_node))
    proc = subprocess.Popen(line, env=environment)
    try:
        while True:
            try:
                return proc.wait()
            except KeyboardInterrupt:   # Ctrl-C: mpiexec passes SIGINT on to every rank
                proc.send_signal(signal.SIGINT)
    finally:
        if run_folder != given:
            shutil.rmtree(run_folder, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
