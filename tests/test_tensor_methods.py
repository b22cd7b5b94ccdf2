"""Tensor's methods come from one table (``pyflow/framework/tensor_methods.py``, ``METHODS``).

Every attribute of ``Tensor`` is defined in its class body (``tensor.py``) or in ``METHODS``, never in
both; the framework alone gives them all, and importing the layers above (autograd, distributed, nn...)
sets none: they plug in through the table's two hooks instead of wrapping methods.
"""

import ast
import pathlib
import subprocess
import sys
import textwrap

import pyflow as flow
import pytest
from pyflow.errors import AutogradError, DistributedError
from pyflow.framework import tensor_methods
from pyflow.framework.tensor import Tensor
from pyflow.framework.tensor_methods import METHODS

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _class_body_names() -> set:
    """The names ``class Tensor:`` itself defines in ``tensor.py`` (methods, properties, slots, attributes)."""
    tree = ast.parse((ROOT / "pyflow" / "framework" / "tensor.py").read_text())
    (cls,) = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "Tensor"]
    names = set()
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def test_every_attribute_comes_from_the_class_body_or_the_table():
    body = _class_body_names()
    assert not body & set(METHODS), "defined twice"
    own = {name for name in vars(Tensor) if name not in ("__dict__", "__module__", "__qualname__", "__doc__",
                                                          "__firstlineno__", "__static_attributes__")}
    own -= set(Tensor.__slots__)   # (their descriptors)
    expected = body | set(METHODS)
    assert own == expected, (f"from neither tensor.py's class body nor METHODS: {sorted(own - expected)}; "
                             f"missing: {sorted(expected - own)}")
    for name, method in METHODS.items():
        assert vars(Tensor)[name] is method, name


def test_every_public_name_of_dir_is_in_the_table_or_the_class_body():
    body = _class_body_names()
    public = {name for name in dir(Tensor) if not name.startswith("_")}
    assert public <= body | set(METHODS), sorted(public - body - set(METHODS))


def test_the_framework_alone_gives_every_method_and_no_layer_above_sets_one():
    """In a fresh process, ``pyflow.framework`` imported without ``pyflow/__init__.py`` (a bare package
    stands in for it), then the real ``pyflow/__init__.py`` run: Tensor's attributes are the same objects."""
    script = textwrap.dedent(f"""
        import sys, types
        package = types.ModuleType("pyflow")
        package.__path__ = [{str(ROOT / "pyflow")!r}]
        package.__file__ = {str(ROOT / "pyflow" / "__init__.py")!r}
        sys.modules["pyflow"] = package
        import pyflow.framework
        from pyflow.framework.tensor import Tensor
        from pyflow.framework.tensor_methods import METHODS
        assert "pyflow.autograd" not in sys.modules and "pyflow.distributed" not in sys.modules
        before = dict(vars(Tensor))
        assert set(METHODS) <= set(before)
        with open(package.__file__) as f:
            exec(compile(f.read(), package.__file__, "exec"), package.__dict__)   # import pyflow: everything
        assert "pyflow.autograd" in sys.modules and "pyflow.distributed" in sys.modules
        after = dict(vars(Tensor))
        changed = sorted(k for k in set(before) | set(after) if before.get(k) is not after.get(k))
        assert not changed, changed
        print("same", len(after))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("same")


def test_without_the_layers_above_the_methods_say_what_to_import(monkeypatch):
    """The hooks unset (as with ``pyflow.framework`` alone): reading autograd state works, changing it or
    making a global tensor names the package to import."""
    monkeypatch.setattr(tensor_methods, "_autograd", None)
    monkeypatch.setattr(tensor_methods, "_global_methods", None)
    x = flow.tensor([1.0, 2.0])
    assert (x.requires_grad, x.grad, x.grad_fn, x.is_leaf) == (False, None, None, True)
    assert x.to_local() is x and x[[1, 0]].tolist() == [2.0, 1.0]
    with pytest.raises(AutogradError, match="needs pyflow.autograd"):
        x.requires_grad_()
    placement = flow.placement("cpu", ranks=[0])
    with pytest.raises(DistributedError, match="needs pyflow.distributed"):
        x.to_global(placement, flow.sbp.broadcast)
