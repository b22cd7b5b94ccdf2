"""Where the compiled tier keeps the modules it writes: files named by a hash of their text, imported from there.

Last steps of the pipeline (kernel source -> translate -> fission -> writer ->
compiled): ``compiled.py`` writes each kernel's module (``writer.write_module``), and
the typing step its "shadow" (``shadow_types.py``), into the cache directory
(``PYFLOW_SIM_CACHE``, default ``~/.cache/pyflow/sim``) and imports it from there.  A
module's name is made from a hash of its text, so the same text is the same file in
every run and every process: numba's ``cache=True`` keeps the machine code beside it
between runs, and a student can open the file a launch ran.

The directory is bounded (``PYFLOW_SIM_CACHE_MB``, default 2048): every new kernel text
is a new module, and property tests make thousands (one developer's cache reached 3 GB
and 120,000 files).  The first time a process writes a module, and the cache was not
looked at in the last hour (``.last-trim``: reading 120,000 files' sizes takes seconds),
``trim`` deletes the least recently used modules and numba's files for them until the
cache is under 80% of its bound; a module used in the last hour stays (another process
may be running it).  A module's last use is its file's access time, which
``load_module`` sets when it imports the file; its modification time never changes
(numba's cache compares it, and would compile again).
A deleted module is written and compiled again when a launch needs it.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import sys
import tempfile
import threading
import time

__all__ = ["cache_dir", "load_module", "compiled_before", "trim"]

_PREFIX = "pyflow_sim_"
_KEEP_SECONDS = 3600.0   # trim never deletes a module used more recently (another process may run it)
_trimmed = False         # trim runs once per process, at its first write


def cache_dir() -> str:
    """Where generated modules (and numba's machine code beside them) are kept."""
    wanted = os.environ.get("PYFLOW_SIM_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "pyflow", "sim")
    try:
        os.makedirs(wanted, exist_ok=True)
        probe = os.path.join(wanted, f".probe-{os.getpid()}")
        open(probe, "w").close()
        os.remove(probe)
        return wanted
    except OSError:
        fallback = os.path.join(tempfile.gettempdir(), f"pyflow-sim-{os.getuid() if hasattr(os, 'getuid') else 0}")
        os.makedirs(fallback, exist_ok=True)
        return fallback


def _module_path(source: str, stem: str) -> tuple:
    """(module name, file) of ``source`` in the cache directory: the name is made from a hash of the text."""
    name = f"{_PREFIX}{stem}_{hashlib.sha1(source.encode()).hexdigest()[:16]}"
    return name, os.path.join(cache_dir(), name + ".py")


def load_module(source: str, stem: str):
    """Import ``source`` as a module kept in the cache directory (named by a hash of its text)."""
    name, path = _module_path(source, stem)
    found = sys.modules.get(name)
    if found is not None:
        return found
    if os.path.exists(path):
        _used(path)
    else:
        _trim_once()
        tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
        with open(tmp, "w") as f:
            f.write(source)
        os.replace(tmp, path)   # atomic: another process may be writing the same text
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def compiled_before(source: str, stem: str, functions) -> bool:
    """Did a run before this one compile ``source``'s module: is its file in the cache directory, with numba's
    index of machine code beside it for each of ``functions`` (top-level ``njit`` functions of the module)?

    Then ``load_module`` and numba's compile only read files (milliseconds), where a compile from nothing
    takes 0.1-1 s.  numba keeps a function's index in ``__pycache__`` as ``<module>.<function>-<line>.pyXY.nbi``,
    ``<line>`` the first line of its definition, decorator included (``co_firstlineno``); a function whose
    index is missing, or a module not there, is not compiled before.  An index that no longer matches its file
    (numba's own check, when it loads) only makes the compile happen after all.
    """
    name, path = _module_path(source, stem)
    if not os.path.exists(path):
        return False
    lines = source.splitlines()
    tag = f"py{sys.version_info[0]}{sys.version_info[1]}"
    for function in functions:
        line = next((i for i, text in enumerate(lines, 1) if text.startswith(f"def {function}(")), None)
        if line is None:
            return False
        while line > 1 and lines[line - 2].startswith("@"):   # the decorators belong to the definition
            line -= 1
        if not os.path.exists(os.path.join(os.path.dirname(path), "__pycache__", f"{name}.{function}-{line}.{tag}.nbi")):
            return False
    return True


def _used(path: str) -> None:
    """Mark the module at ``path`` used now: its access time (``trim`` keeps the recently used), not its
    modification time (numba's cache checks that one)."""
    with contextlib.suppress(OSError):   # a read-only cache still serves
        os.utime(path, (time.time(), os.stat(path).st_mtime))


def _trim_once() -> None:
    global _trimmed
    if not _trimmed:
        _trimmed = True
        try:
            folder = cache_dir()
            marker = os.path.join(folder, ".last-trim")   # its time: when a process last looked (at most hourly)
            if os.path.exists(marker) and time.time() - os.path.getmtime(marker) < _KEEP_SECONDS:
                return
            open(marker, "w").close()
            limit_mb = float(os.environ.get("PYFLOW_SIM_CACHE_MB", "2048"))
            trim(folder, int(limit_mb * (1 << 20)))
        except (OSError, ValueError):   # a cache that cannot be trimmed still serves
            pass


def trim(directory: str, limit_bytes: int, now: float | None = None) -> list:
    """Delete the least recently used modules of ``directory`` (and numba's ``__pycache__`` files for them)
    until it holds under 80% of ``limit_bytes``; nothing if it holds less than ``limit_bytes``.  Modules used
    (written or loaded: the later of the file's access and modification times) within the last hour before
    ``now`` stay.  The names of the modules deleted, least recently used first.
    """
    now = time.time() if now is None else now
    modules = {}   # module name -> [bytes, last used, files]
    with os.scandir(directory) as entries:
        for entry in entries:
            if entry.name.startswith(_PREFIX) and entry.name.endswith(".py"):
                stat = entry.stat()
                modules[entry.name[:-3]] = [stat.st_size, max(stat.st_atime, stat.st_mtime), [entry.path]]
    pycache = os.path.join(directory, "__pycache__")
    if os.path.isdir(pycache):
        with os.scandir(pycache) as entries:
            for entry in entries:
                owner = modules.get(entry.name.split(".", 1)[0])
                if owner is not None:
                    owner[0] += entry.stat().st_size
                    owner[2].append(entry.path)
    total = sum(size for size, _, _ in modules.values())
    if total <= limit_bytes:
        return []
    deleted = []
    for name, (size, used, files) in sorted(modules.items(), key=lambda item: item[1][1]):
        if total <= 0.8 * limit_bytes or now - used < _KEEP_SECONDS:
            break
        for path in files:
            with contextlib.suppress(FileNotFoundError):   # another process trimming too
                os.remove(path)
        total -= size
        deleted.append(name)
    return deleted
