"""Where the compiled tier keeps the modules it writes: files named by a hash of their text, imported from there.

Last steps of the pipeline (kernel source -> translate -> fission -> writer ->
compiled): ``compiled.py`` writes each kernel's module (``writer.write_module``), and
the typing step its "shadow" (``shadow_types.py``), into the cache directory
(``PYFLOW_SIM_CACHE``, default ``~/.cache/pyflow/sim``) and imports it from there.  A
module's name is made from a hash of its text, so the same text is the same file in
every run and every process: numba's ``cache=True`` keeps the machine code beside it
between runs, and a student can open the file a launch ran.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import tempfile
import threading

__all__ = ["cache_dir", "load_module"]


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


def load_module(source: str, stem: str):
    """Import ``source`` as a module kept in the cache directory (named by a hash of its text)."""
    name = f"pyflow_sim_{stem}_{hashlib.sha1(source.encode()).hexdigest()[:16]}"
    found = sys.modules.get(name)
    if found is not None:
        return found
    path = os.path.join(cache_dir(), name + ".py")
    if not os.path.exists(path):
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
