"""The compiled tier's module cache stays bounded (kernels/sim/module_cache.trim), least recently used first."""

from __future__ import annotations

import os
import sys

from hypothesis import given, settings
from hypothesis import strategies as st

from pyflow.kernels.sim import module_cache

HOUR = 3600.0


def _module(folder, name: str, written: float, size: int, numba_files: int) -> list:
    """A fake generated module and numba's cache files for it, written at ``written``; all their paths."""
    paths = [os.path.join(folder, f"pyflow_sim_{name}.py")]
    paths += [os.path.join(folder, "__pycache__", f"pyflow_sim_{name}.cu_launch-{i}.py311.nbi")
              for i in range(numba_files)]
    for path in paths:
        with open(path, "wb") as f:
            f.write(b"x" * size)
        os.utime(path, (written, written))
    return paths


@settings(max_examples=25, deadline=None)
@given(ages=st.lists(st.floats(0, 10 * HOUR), min_size=1, max_size=12), size=st.integers(1, 400),
       numba_files=st.integers(0, 3), limit=st.integers(0, 8000))
def test_trim_deletes_the_least_recently_used_modules_with_their_numba_files_and_spares_the_last_hours(
        tmp_path_factory, ages, size, numba_files, limit):
    folder = tmp_path_factory.mktemp("sim")
    os.makedirs(folder / "__pycache__")
    now = 1e9
    files = {f"k{i}": _module(folder, f"k{i}", now - age, size, numba_files) for i, age in enumerate(ages)}
    other = folder / "__pycache__" / "something_else.nbi"   # not a module's: never touched
    other.write_bytes(b"y")
    module_bytes = size * (1 + numba_files)
    total = module_bytes * len(ages)

    deleted = module_cache.trim(str(folder), limit, now=now)

    age = dict((f"pyflow_sim_k{i}", a) for i, a in enumerate(ages))
    assert deleted == sorted(deleted, key=lambda name: -age[name]), "least recently used first"
    if total <= limit:
        assert deleted == []
    kept = total - module_bytes * len(deleted)
    remaining = sorted((a for name, a in age.items() if name not in deleted), reverse=True)
    # it stops once under 80% of the limit, or at a module of the last hour: never sooner
    assert total <= limit or kept <= 0.8 * limit or (remaining and remaining[0] < HOUR)
    assert all(age[name] >= HOUR for name in deleted), "a module of the last hour was deleted"
    if deleted:   # and never later than needed: without the last one deleted it was still over
        assert kept + module_bytes > 0.8 * limit
    for i in range(len(ages)):
        gone = f"pyflow_sim_k{i}" in deleted
        assert all(os.path.exists(p) != gone for p in files[f"k{i}"])
    assert other.exists()


def test_a_process_trims_at_its_first_write_only(tmp_path, monkeypatch):
    monkeypatch.setenv("PYFLOW_SIM_CACHE", str(tmp_path))
    monkeypatch.setenv("PYFLOW_SIM_CACHE_MB", "0")
    monkeypatch.setattr(module_cache, "_trimmed", False)
    calls = []
    monkeypatch.setattr(module_cache, "trim", lambda folder, limit: calls.append((folder, limit)) or [])
    module_cache.load_module("A = 1\n", "trim_probe")
    module_cache.load_module("A = 1\n", "trim_probe")      # imported already: no write
    module_cache.load_module("A = 2\n", "trim_probe")      # a second write: no second trim
    assert calls == [(str(tmp_path), 0)]
    monkeypatch.setattr(module_cache, "_trimmed", False)    # another process, within the hour: no trim either
    module_cache.load_module("A = 3\n", "trim_probe")
    assert calls == [(str(tmp_path), 0)]
    old = os.path.getmtime(tmp_path / ".last-trim") - 2 * HOUR
    os.utime(tmp_path / ".last-trim", (old, old))
    monkeypatch.setattr(module_cache, "_trimmed", False)    # one more than an hour later: it looks again
    module_cache.load_module("A = 4\n", "trim_probe")
    assert calls == [(str(tmp_path), 0)] * 2


def test_loading_a_module_marks_it_used_and_keeps_the_time_numba_checks(tmp_path, monkeypatch):
    """A load from disk sets the file's access time to now (trim's 'last used') and leaves its modification
    time (numba's cache compares it): a module written long ago but loaded now is not the one trim deletes."""
    monkeypatch.setenv("PYFLOW_SIM_CACHE", str(tmp_path))
    monkeypatch.setattr(module_cache, "_trimmed", True)
    old, new = "B = 1\n", "B = 2\n"
    for source in (old, new):
        module_cache.load_module(source, "lru_probe")
    paths = sorted(tmp_path.glob("pyflow_sim_lru_probe_*.py"))
    reloaded = next(p for p in paths if p.read_text() == old)   # (read before the times are set: a read sets atime)
    long_ago = 1e9
    for path in paths:
        os.utime(path, (long_ago, long_ago))
    for name in [n for n in list(sys.modules) if n.startswith("pyflow_sim_lru_probe_")]:
        del sys.modules[name]   # as in a new process
    module_cache.load_module(old, "lru_probe")
    assert os.stat(reloaded).st_mtime == long_ago
    assert os.stat(reloaded).st_atime > long_ago + 10 * HOUR
    other = next(p for p in paths if p != reloaded)
    assert module_cache.trim(str(tmp_path), 1, now=long_ago + 2 * HOUR) == [other.stem]
