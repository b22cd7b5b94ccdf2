"""One name, one class: a class name is defined in one module of the package only.

Two classes with one name make a reader (and an ``except`` clause, an ``isinstance`` check, a search)
take one for the other: ``except flow.errors.StateDictError`` once missed the models' own
``StateDictError``, and "Stream" named three different things (OneFlow's Stream symbol, ``ep::Stream``
and ``vm::Stream``).  Classes are found by their ``class`` statements (``ast``), so a name
re-exported by a package's ``__init__`` is not a second definition.  Functions are not checked: one
protocol has many implementations (each compiler pass's ``run``, each kernel module's ``ptx_cases``).
Names starting with "_" are private helpers, seen in their own module only: they are left out.  There
is no list of exceptions: a clash is resolved by naming one side for what it is (``EpDevice`` beside
the ``Device`` symbol, the simulator's fission ``BarrierNode`` beside the VM's ``Barrier`` policy).
"""

import ast
import collections
import importlib.util
import pathlib
import pkgutil

import pyflow
import pyflow.kernels


def package_modules():
    """(module name, source path) of every module of pyflow, kernels/ (pyflow.kernels) included.

    A package that fails to import raises (pkgutil would skip its modules silently)."""
    def fail(name):
        raise ImportError(f"cannot walk {name}: it does not import")

    for package in (pyflow, pyflow.kernels):
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + ".", onerror=fail):
            yield info.name, pathlib.Path(importlib.util.find_spec(info.name).origin)


def class_definitions():
    """Public class name -> the modules that define a class of that name (nested classes included)."""
    defined = collections.defaultdict(set)
    for module, path in package_modules():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                defined[node.name].add(module)
    return defined


def test_the_walk_sees_every_layer():
    modules = {name for name, _ in package_modules()}
    assert {"pyflow.errors", "pyflow.framework.tensor", "pyflow.vm.stream", "pyflow.device.ep.base",
            "pyflow.kernels.sim.fission", "pyflow.cocktailer.trace"} <= modules


def test_no_class_name_is_defined_in_two_modules():
    clashes = {name: sorted(modules) for name, modules in class_definitions().items() if len(modules) > 1}
    assert not clashes, f"class names defined in more than one module (rename one for what it is): {clashes}"
