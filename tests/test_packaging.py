"""The package layout a fresh install depends on."""

import ast
import pathlib
import re
import subprocess
import sys

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the test extra installs tomli, the same parser
    import tomli as tomllib

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


def test_license_is_apache_2_and_shipped():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text


def test_default_test_command_collects_every_doctest_under_its_installed_name():
    """`python -m pytest` (the README's command) also runs the >>> examples of pyflow/ and kernels/.

    Every module with an example is collected, except those conftest.py's DOCTEST_EXCLUDED lists,
    and each is imported by the name it is installed as: kernels/layout.py as pyflow.kernels.layout.
    """
    # the command's testpaths name both folders; collecting just them (not tests/, 140 modules to import,
    # 30 s on a loaded machine) asks the same question of the same configuration
    testpaths = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["testpaths"]
    assert {"pyflow", "kernels"} <= set(testpaths), testpaths
    run = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                          "pyflow", "kernels"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    collected = {}
    for line in run.stdout.splitlines():
        path, sep, name = line.partition("::")
        if sep and path.startswith(("pyflow/", "kernels/")):
            collected.setdefault(path, []).append(name)
    assert collected, "no doctest collected:\n" + run.stdout[-4000:]

    conftest = ast.parse((ROOT / "conftest.py").read_text())
    excluded = next(ast.literal_eval(node.value) for node in conftest.body if isinstance(node, ast.Assign)
                    and any(getattr(t, "id", None) == "DOCTEST_EXCLUDED" for t in node.targets))
    with_examples = {p.relative_to(ROOT).as_posix()
                     for p in list((ROOT / "pyflow").rglob("*.py")) + list((ROOT / "kernels").rglob("*.py"))
                     if re.search(r"^\s*>>> ", p.read_text(), re.MULTILINE)}
    missing = with_examples - set(collected) - set(excluded)
    assert not missing, f"modules with >>> examples that the test command does not collect: {sorted(missing)}"

    for path, names in collected.items():
        parts = pathlib.PurePosixPath(path).with_suffix("").parts
        parts = parts[:-1] if parts[-1] == "__init__" else parts
        module = ".".join(("pyflow",) + parts if parts[0] == "kernels" else parts)
        wrong = [n for n in names if n != module and not n.startswith(module + ".")]
        assert not wrong, f"{path} collected under another name than {module}: {wrong}"


def test_ci_runs_the_readmes_two_commands_and_installs_what_they_need():
    """`.ci/run` runs the README's set-up and test commands as written (in its own venv), and the test command's
    plugins come with the `test` extra: `-n auto` needs pytest-xdist, or a fresh install cannot run it."""
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"```bash\n# 1\. .*?```", readme, re.S).group(0)
    commands = [line for line in block.splitlines() if line and not line.startswith(("#", "```"))]
    assert len(commands) == 2, commands
    setup, test = commands
    ci = (ROOT / ".ci" / "run").read_text()
    in_ci_venv = test.replace(".venv/bin/python", '"$VENV"/bin/python')
    assert any(line.strip() == in_ci_venv for line in ci.splitlines()), f"CI does not run {test!r}"
    assert '-e ".[test]"' in setup and '-e ".[test]"' in ci
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["test"]
    if " -n " in f" {test} ":
        assert any(req.startswith("pytest-xdist") for req in extra), extra
