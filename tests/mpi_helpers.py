"""Run test code as the ranks of an MPI job, and collect what every rank returned.

``run_job(calls, nproc)`` writes ``calls`` (test functions or helpers, named
``"module:function"``) to a fresh folder and runs this file as a script under
``mpiexec -n nproc`` (or ``python -m pyflow.distributed.launch --nproc_per_node
nproc``, or plain ``python``: one process, where ``flow.distributed.run`` runs
ranks as threads).  Each process imports pyflow, which makes it its MPI rank;
then it calls every function in turn and pickles, per call, ``("ok", value,
seconds)`` or ``("error", type name, message, traceback, seconds)`` into
``rank-<r>.results``.  A test function that calls ``flow.distributed.run(body,
world_size)`` thus runs unchanged: under MPI, ``run`` runs ``body`` as this
process's rank and gathers every rank's result, so its asserts run on every
rank.  Parametrized tests are called with the values of their
``@pytest.mark.parametrize`` marks, picked by index.

Each rank also leaves ``rank-<r>.pid`` (``PYFLOW_LAUNCH_DIR``), so a test can
check that no process outlived its job (``Job.survivors``).  ``mpi_missing()``
says why MPI tests cannot run here (mpi4py or mpiexec missing), or None.

MPICH (the ``dist`` extra) or Open MPI 4 or 5 (``mpi_flavor()``, from
``mpiexec --version``): a plain ``mpiexec`` job is ``pyflow.distributed.launch.
local_job``'s, as the benchmarks' are: with Open MPI, ``--map-by
ppr:N:node:OVERSUBSCRIBE --bind-to none`` (its default refuses more processes
than cores; MPICH's does not), and, run as root, ``OMPI_ALLOW_RUN_AS_ROOT=1``
and ``OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1`` (it refuses root otherwise), which
reach ``launch``'s mpiexec too.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def mpiexec() -> str | None:
    """The mpiexec next to this Python (the ``mpich`` wheel puts it there), else the one on PATH."""
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return here if os.access(here, os.X_OK) else shutil.which("mpiexec")


_FLAVOR: list = []


def mpi_flavor() -> str:
    """``"openmpi"`` or ``"mpich"``: the MPI of ``mpiexec()`` (``pyflow.distributed.launch.mpi_flavor``)."""
    if not _FLAVOR:
        from pyflow.distributed.launch import mpi_flavor as flavor_of

        _FLAVOR.append(flavor_of(mpiexec()) if mpiexec() else "mpich")
    return _FLAVOR[0]


def mpi_missing() -> str | None:
    """Why MPI tests cannot run here, or None (pip install -e '.[dist]' installs both)."""
    if importlib.util.find_spec("mpi4py") is None:
        return "mpi4py is not installed (pip install -e '.[dist]')"
    if mpiexec() is None:
        return "no mpiexec found (pip install -e '.[dist]' installs MPICH's)"
    return None


@dataclasses.dataclass
class Job:
    """What an MPI job left: its exit status, output, and every rank's outcome of every call."""

    returncode: int
    stdout: str
    stderr: str
    seconds: float
    results: dict   # rank -> [("ok", value, s) | ("error", type, message, traceback, s), ...]
    pids: dict      # rank -> pid

    def outcome(self, rank: int, call: int):
        calls = self.results.get(rank, [])
        return calls[call] if call < len(calls) else None

    def values(self, nproc: int, call: int = 0) -> list:
        """Every rank's value of call ``call``; fails with the rank's traceback otherwise."""
        values = []
        for rank in range(nproc):
            outcome = self.outcome(rank, call)
            assert outcome is not None, f"rank {rank} left no result\n{self.explain()}"
            assert outcome[0] == "ok", f"rank {rank}: {outcome[1]}: {outcome[2]}\n{outcome[3]}"
            values.append(outcome[1])
        return values

    def survivors(self) -> list:
        """The ranks whose process still runs.  A zombie has ended: Open MPI's ``mpiexec`` may return before its
        processes are reaped (then by init)."""
        alive = []
        for rank, pid in self.pids.items():
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                continue
            except PermissionError:
                pass
            try:
                with open(f"/proc/{pid}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                        continue
            except (OSError, IndexError):
                pass
            alive.append(rank)
        return alive

    def explain(self) -> str:
        return (f"exit status {self.returncode} after {self.seconds:.1f} s\n--- stdout\n{self.stdout[-4000:]}\n"
                f"--- stderr\n{self.stderr[-6000:]}")


def call(target: str, *args, params: dict | None = None, **kwargs) -> dict:
    """One call of a job: ``"module:function"`` with arguments, or a parametrized test's case (``params``:
    argnames -> index into that ``@pytest.mark.parametrize`` mark's values)."""
    return {"target": target, "args": list(args), "kwargs": kwargs, "params": params or {}}


def run_job(calls: list, nproc: int, launcher: str = "mpiexec", timeout: float = 120, env: dict | None = None,
            extra: tuple = ()) -> Job:
    """Run ``calls`` on ``nproc`` processes (``launcher``: mpiexec, launch or python)."""
    folder = tempfile.mkdtemp(prefix="pyflow-mpi-job-")
    try:
        with open(os.path.join(folder, "calls.json"), "w") as out:
            json.dump(calls, out)
        script = [sys.executable, os.path.abspath(__file__), folder]
        environment = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
                           PYFLOW_LAUNCH_DIR=folder, **(env or {}))
        if launcher == "mpiexec":
            from pyflow.distributed.launch import local_job

            command, environment = local_job(nproc, [*extra, *script], mpiexec=mpiexec(), flavor=mpi_flavor(),
                                             environ=environment)
        elif launcher == "launch":   # its mpiexec runs in this environment (Open MPI as root)
            from pyflow.distributed.launch import job_environment

            command = [sys.executable, "-m", "pyflow.distributed.launch", "--nproc_per_node", str(nproc), *extra,
                       *script[1:]]
            environment = job_environment(mpi_flavor(), environment)
        else:
            command = script
        start = time.monotonic()
        proc = subprocess.Popen(command, cwd=ROOT, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)   # mpiexec passes it on to every rank
            try:
                stdout, stderr = proc.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                stdout, stderr = proc.communicate()
            stderr += f"\n[mpi_helpers: the job ran past {timeout:g} s and was stopped]"
        seconds = time.monotonic() - start
        results, pids = {}, {}
        for name in os.listdir(folder):
            path = os.path.join(folder, name)
            if name.endswith(".results"):
                with open(path, "rb") as f:
                    results[int(name[5:-8])] = pickle.load(f)
            elif name.endswith(".pid"):
                with open(path) as f:
                    pids[int(name[5:-4])] = int(f.read().split()[0])
        return Job(proc.returncode, stdout, stderr, seconds, results, pids)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# --- the script each rank runs -------------------------------------------------------------------------------------


def _resolve(spec: dict):
    module_name, name = spec["target"].split(":")
    fn = getattr(importlib.import_module(module_name), name)
    kwargs = dict(spec["kwargs"])
    for mark in getattr(fn, "pytestmark", []):
        if mark.name != "parametrize":
            continue
        names = [n.strip() for n in (mark.args[0].split(",") if isinstance(mark.args[0], str) else mark.args[0])]
        key = ", ".join(names)
        if key in spec["params"]:
            values = mark.args[1][spec["params"][key]]
            values = getattr(values, "values", values)   # a pytest.param
            kwargs.update(zip(names, values if len(names) > 1 else [values]))
    return fn, spec["args"], kwargs


def _main(folder: str) -> None:
    import pyflow as flow   # under mpiexec: this process becomes its MPI rank

    rank = flow.env.get_rank()
    with open(os.path.join(folder, "calls.json")) as f:
        calls = json.load(f)
    results = []
    for spec in calls:
        start = time.monotonic()
        try:
            fn, args, kwargs = _resolve(spec)
            value = fn(*args, **kwargs)
            outcome = ("ok", value, time.monotonic() - start)
        except BaseException as error:  # noqa: BLE001 - recorded for the test, which decides
            outcome = ("error", type(error).__name__, str(error), traceback.format_exc(), time.monotonic() - start)
        try:
            pickle.dumps(outcome)
        except Exception as error:  # noqa: BLE001 - a value that cannot be pickled is reported, not lost
            outcome = ("error", "PicklingError", f"the result cannot be pickled: {error}", "", outcome[-1])
        results.append(outcome)
        with open(os.path.join(folder, f"rank-{rank}.results.tmp"), "wb") as out:
            pickle.dump(results, out)
        os.replace(os.path.join(folder, f"rank-{rank}.results.tmp"), os.path.join(folder, f"rank-{rank}.results"))


if __name__ == "__main__":
    _main(sys.argv[1])
