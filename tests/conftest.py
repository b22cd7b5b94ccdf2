"""Test-suite settings shared by every test module.

* hypothesis profiles: "ci" (the default: derandomized, so every run checks the
  same examples; no deadline, because simulated kernels are slow) and "dev"
  (random examples, more of them).  Pick one with HYPOTHESIS_PROFILE=dev.
* ``@pytest.mark.gpu`` tests are skipped, with the reason shown, unless the
  backend is a real GPU (``PYFLOW_CUDA=gpu``); ``-m gpu`` selects them.
"""

import os

import pytest
from hypothesis import HealthCheck, settings

from pyflow.kernels.backend import describe, is_gpu

settings.register_profile(
    "ci", derandomize=True, deadline=None, max_examples=20,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "dev", deadline=None, max_examples=100, suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_report_header(config):
    return f"pyflow backend: {describe()}"


def pytest_collection_modifyitems(config, items):
    if is_gpu():
        return
    no_gpu = pytest.mark.skip(reason="needs a real GPU (PYFLOW_CUDA=gpu)")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(no_gpu)
