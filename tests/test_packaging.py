"""The package layout a fresh install depends on."""

import pathlib
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_every_package_directory_is_listed_in_pyproject():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    found = {".".join(("pyflow",) + p.parent.relative_to(ROOT / "pyflow").parts)
             for p in (ROOT / "pyflow").rglob("__init__.py")}
    found |= {".".join(("pyflow", "kernels") + p.parent.relative_to(ROOT / "kernels").parts)
              for p in (ROOT / "kernels").rglob("__init__.py")}
    assert found == listed, f"missing from pyproject: {found - listed}; stale: {listed - found}"
    assert config["package-dir"] == {"pyflow.kernels": "kernels"}


def test_kernels_import_nothing_from_pyflow_but_errors():
    """kernels/ is the bottom layer: device code may not reach up into the runtime."""
    offenders = []
    for path in (ROOT / "kernels").rglob("*.py"):
        for line in path.read_text().splitlines():
            stripped = line.strip()
            if stripped.startswith(("import pyflow", "from pyflow")) and not (
                stripped.startswith(("from pyflow.kernels", "from pyflow.errors", "import pyflow.kernels"))
            ):
                offenders.append(f"{path.relative_to(ROOT)}: {stripped}")
    assert not offenders, offenders


def test_only_the_backend_module_imports_numba_cuda():
    offenders = []
    for path in list((ROOT / "kernels").rglob("*.py")) + list((ROOT / "pyflow").rglob("*.py")):
        if path.name == "backend.py":
            continue
        for line in path.read_text().splitlines():
            if line.strip().startswith("from numba import cuda") or line.strip() == "import numba.cuda":
                offenders.append(f"{path.relative_to(ROOT)}: {line.strip()}")
    assert not offenders, offenders
