"""Imports point down ARCHITECTURE's layers: no upward import, no package cycle, no private name across packages.

``/work/shared/design/ARCHITECTURE.md`` draws pyflow as floors, imports pointing only down.
This test reads the source of ``pyflow/`` and ``kernels/`` (installed as ``pyflow.kernels``)
with ``ast`` (nothing is imported), finds every import, top-level or inside a function,
method or class, and checks three rules between *packages* (``pyflow.vm``,
``pyflow.framework``, ...; a subpackage such as ``pyflow.compiler.boxing`` belongs to
``pyflow.compiler``, and a top-level module such as ``pyflow/env.py`` is a package of its own):

1. **layers**: a package imports only from its own floor or lower ones (``FLOORS``);
2. **no cycles**: the package graph, from all imports, has no cycle;
3. **no private names across packages**: ``from pyflow.x.y import _name``, a private
   module (``pyflow.ops._grad``) or ``module._name`` on an imported module is used only
   inside its own package.

A function-local import (``def f(): from pyflow.distributed import ...``) hides an upward
dependence from import time, not from the design: it is checked like any other.

Today's code breaks these rules in places other people are fixing (issue 30), so
``KNOWN`` lists each violation with its plan.  The tests fail on a violation not in
``KNOWN`` (a new one: fix the import) and on a ``KNOWN`` entry that no longer happens (a
fixed one: delete its line), so the list only shrinks.  Keys carry no line numbers.

    .venv/bin/python tests/test_layers.py               # every violation, with where it happens
    .venv/bin/python tests/test_layers.py --print-known # today's violations in KNOWN's format
"""

from __future__ import annotations

import ast
import collections
import dataclasses
import functools
import pathlib
import sys
import textwrap

ROOT = pathlib.Path(__file__).resolve().parents[1]

# (source folder, the dotted name it is installed as): pyproject.toml maps kernels/ to pyflow.kernels.
SOURCES = ((ROOT / "pyflow", "pyflow"), (ROOT / "kernels", "pyflow.kernels"))

# The floors, top to bottom.  A package may import from its own floor and every floor below.
# ARCHITECTURE's list is: public API > graph > runtime > compiler > nn, optim > autograd >
# cocktailer > distributed > framework > vm > device > kernels.  The packages it does not
# name are placed by what they import and who imports them:
FLOORS = (
    # Users of the public API, like tutorials/: ``python -m pyflow`` and the seven Cocktailer
    # models (applications of cocktailer and, after issue 30, of flow ops through ``import
    # pyflow``); nothing inside the library may import them.
    ("pyflow.__main__", "pyflow.models"),
    # The public API: pyflow/__init__.py, and the two top-level modules that are facades only it
    # imports: ``flow.cuda`` (over device, vm, framework) and ``flow.save``/``flow.load`` (over
    # nn.Parameter and framework).
    ("pyflow", "pyflow.cuda", "pyflow.serialization"),
    ("pyflow.graph",),
    ("pyflow.runtime",),
    ("pyflow.compiler",),
    # flow.utils.data (Dataset, DataLoader) is training-script tooling beside nn and optim, as
    # torch.utils.data is; it needs only framework and env.
    ("pyflow.nn", "pyflow.optim", "pyflow.utils"),
    ("pyflow.autograd",),
    ("pyflow.cocktailer",),
    ("pyflow.distributed",),
    # Op definitions (inference, kernels per target, backward, and after issue 30 SBP
    # signatures and uTask lowerings) over framework's registry: read by autograd, optim,
    # distributed and cocktailer, so below them; they use framework, so above it.
    ("pyflow.ops",),
    ("pyflow.framework",),
    # Timelines: trace's Tracer is the VM's on_release hook (it imports vm only); the runtime's
    # and Cocktailer's timelines draw with it, so it is a service just above the vm.
    ("pyflow.trace",),
    ("pyflow.vm",),
    ("pyflow.device",),
    # The rank context: what one process owns (its vm, devices, rank id) hangs off it; it imports
    # nothing from pyflow.  Device code (kernels) must not depend on a rank, so it sits above them.
    ("pyflow.env",),
    ("pyflow.kernels",),
    # Leaves that import nothing from pyflow and that everyone may import: the exception classes,
    # and the interpreter-exit hook that pyflow/__init__.py registers first and the vm marks.
    ("pyflow.errors", "pyflow._exit"),
)


@dataclasses.dataclass(frozen=True)
class Import:
    """One imported module (and name, for ``from m import name``) at one place in the source."""

    path: str  # the importing file, relative to the repository, for messages
    line: int
    importer: str  # the importing module, dotted
    target: str  # the imported module, dotted
    name: str | None  # ``from target import name`` where name is not itself a module; else None
    local: bool  # inside a function or method: runs when called, not at import time

    @property
    def where(self) -> str:
        imported = f"{self.target}.{self.name}" if self.name else self.target
        return f"{self.path}:{self.line} imports {imported}"


def is_private(name: str) -> bool:
    """``_name`` is private; ``__init__``-style dunder names are not."""
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def package_of(module: str) -> str:
    """``pyflow.compiler.boxing.graph`` -> ``pyflow.compiler``; ``pyflow.env`` -> itself; ``pyflow`` -> itself."""
    return ".".join(module.split(".")[:2])


def find_modules(sources) -> dict[str, pathlib.Path]:
    """Every module under each (folder, dotted name): ``{"pyflow.vm.engine": path, "pyflow.vm": .../__init__.py}``."""
    modules = {}
    for folder, dotted in sources:
        for path in sorted(folder.rglob("*.py")):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join([dotted, *parts])] = path
    return modules


def collect_imports(sources, root: pathlib.Path) -> list[Import]:
    """Every import of a module in ``sources`` from a module in ``sources``, resolved to dotted names.

    ``from a.b import c`` imports module ``a.b.c`` when that module exists, else the name ``c``
    of ``a.b``.  Relative imports are resolved against the importing module's package.
    ``module._name`` attribute reads on a module bound by an import are recorded as imports of
    ``_name`` too, so the private-name rule sees them.
    """
    modules = find_modules(sources)
    found = []
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        shown = path.relative_to(root).as_posix()
        found.extend(_ImportVisitor(module, package, shown, modules).run(ast.parse(path.read_text(), str(path))))
    return found


class _ImportVisitor(ast.NodeVisitor):
    """The imports of one module; ``depth`` > 0 inside a function body."""

    def __init__(self, module: str, package: str, shown: str, modules: dict):
        self.module, self.package, self.shown, self.modules = module, package, shown, modules
        self.depth = 0
        self.found: list[Import] = []
        self.bound: dict[str, str] = {}  # name -> the module an import bound it to, one table per file

    def run(self, tree: ast.AST) -> list[Import]:
        self.visit(tree)
        return self.found

    def add(self, node: ast.AST, target: str, name: str | None = None) -> None:
        self.found.append(Import(self.shown, node.lineno, self.module, target, name, self.depth > 0))

    def visit_FunctionDef(self, node: ast.AST) -> None:
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name in self.modules:
                self.add(node, alias.name)
                if alias.asname:
                    self.bound[alias.asname] = alias.name
                else:  # ``import a.b.c`` binds ``a``; ``a.b.c._x`` is resolved by visit_Attribute
                    self.bound[alias.name.partition(".")[0]] = alias.name.partition(".")[0]

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            parts = self.package.split(".")
            base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
        else:
            base = node.module or ""
        if base not in self.modules:  # numpy, numba, the standard library
            return
        for alias in node.names:
            submodule = f"{base}.{alias.name}"
            if submodule in self.modules:
                self.add(node, submodule)
                self.bound[alias.asname or alias.name] = submodule
            else:
                self.add(node, base, alias.name)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        """``m._name`` or ``a.b.c._name`` where ``m``/``a.b.c`` is a module bound by an import."""
        chain, value = [node.attr], node.value
        while isinstance(value, ast.Attribute):
            chain.append(value.attr)
            value = value.value
        if isinstance(value, ast.Name) and value.id in self.bound and is_private(node.attr):
            dotted = ".".join([self.bound[value.id], *reversed(chain[1:])])
            if dotted in self.modules:
                self.add(node, dotted, node.attr)
        self.generic_visit(node)


# ----------------------------------------------------------------------------------------------- the rules


def floor_of(package: str, floors) -> int | None:
    """The floor's index, 0 at the top; None for a package no floor names."""
    return next((i for i, floor in enumerate(floors) if package in floor), None)


def is_upward(importer: str, target: str, floors) -> bool:
    """Does package ``importer`` sit on a lower floor than package ``target``?"""
    low, high = floor_of(importer, floors), floor_of(target, floors)
    return low is not None and high is not None and high < low


def find_violations(imports: list[Import], floors) -> dict[str, str]:
    """``{stable key: message naming one place}`` for each violation of the three rules (and unplaced packages)."""
    found = {}
    crossing = [imp for imp in imports if package_of(imp.importer) != package_of(imp.target)]
    # 0. every package has a floor
    for package in sorted({package_of(imp.importer) for imp in imports} | {package_of(imp.target) for imp in imports}):
        if floor_of(package, floors) is None:
            found[f"unplaced: {package}"] = (
                f"package {package} is on no floor: add it to FLOORS in tests/test_layers.py, "
                "below everything that imports it and above everything it imports")
    # 1. layers: one entry per (importer module, imported module), "top-level" if any of them runs at import time
    by_edge = collections.defaultdict(list)
    for imp in crossing:
        if is_upward(package_of(imp.importer), package_of(imp.target), floors):
            by_edge[imp.importer, imp.target].append(imp)
    for (importer, target), imps in sorted(by_edge.items()):
        kind = "function-local" if all(imp.local for imp in imps) else "top-level"
        found[f"upward: {importer} -> {target} ({kind})"] = (
            f"{imps[0].where}: {package_of(importer)} is on a lower floor than {package_of(target)} (FLOORS). "
            "Move the code that needs it up, move what it needs down, or pass it in from above "
            "(an argument, or a hook the upper layer installs)")
    # 2. cycles between packages
    edges = collections.defaultdict(dict)  # package -> {imported package: first import}
    for imp in crossing:
        edges[package_of(imp.importer)].setdefault(package_of(imp.target), imp)
    for component in strongly_connected(edges):
        members = sorted(component)
        lines = [f"  {a} -> {b}: {edges[a][b].where}{' (function-local)' if edges[a][b].local else ''}"
                 f"{'   UPWARD' if is_upward(a, b, floors) else ''}"
                 for a in members for b in sorted(edges[a]) if b in component]
        found["cycle: " + ", ".join(members)] = (
            f"packages {', '.join(members)} import each other; remove edges until none is left, first those "
            "marked UPWARD (each is also an 'upward:' violation). One import per edge:\n" + "\n".join(lines))
    # 3. private names across packages: a private part of the path inside the target's package
    for imp in crossing:
        inside = imp.target.split(".")[len(package_of(imp.target).split(".")):] + ([imp.name] if imp.name else [])
        if any(is_private(part) for part in inside):
            imported = f"{imp.target}.{imp.name}" if imp.name else imp.target
            found.setdefault(f"private: {imp.importer} -> {imported}", (
                f"{imp.where}: a private name of {package_of(imp.target)} used from {package_of(imp.importer)}. "
                "Make it public (drop the underscore, add it to __all__ and give it a docstring) "
                "or move the code that needs it into that package"))
    return found


def strongly_connected(edges: dict[str, dict]) -> list[set[str]]:
    """Tarjan's algorithm: the strongly connected components of more than one node."""
    index, low, stack, on_stack, components = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(edges.get(node, ())):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(component)

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return components


@functools.lru_cache(maxsize=None)
def current_violations() -> dict[str, str]:
    """The violations in this checkout's pyflow/ and kernels/ (read once per test session)."""
    return find_violations(collect_imports(SOURCES, ROOT), FLOORS)


# ----------------------------------------------------------------------------------------------- known today

# Violation key -> why it is there and what removes it.  Generated by ``--print-known`` and then
# explained by hand; delete a line when its violation is gone (test_known_violations_still_happen).
KNOWN: dict = {}   # empty since issue 30: every import points down, no cycle, no private name crosses


# ----------------------------------------------------------------------------------------------- the tests


def test_no_new_violations():
    """Every violation in the source is one KNOWN lists: a new one names its import and what to do."""
    new = {key: message for key, message in current_violations().items() if key not in KNOWN}
    assert not new, "imports that break ARCHITECTURE's layers (see tests/test_layers.py):\n\n" + "\n\n".join(
        f"{key}\n{textwrap.indent(message, '    ')}" for key, message in new.items())


def test_known_violations_still_happen():
    """Every KNOWN entry still happens: a fixed one must leave the list, so the list only shrinks."""
    gone = sorted(key for key in KNOWN if key not in current_violations())
    assert not gone, ("fixed, well done: delete these entries from KNOWN in tests/test_layers.py "
                      "(the list only shrinks):\n" + "\n".join(gone))


def test_checker_finds_each_kind(tmp_path):
    """Two fake packages, ``fake.low`` below ``fake.high``: the checker passes the downward import
    and reports the upward one, the cycle it closes, and a private name."""
    files = {
        "fake/__init__.py": "",
        "fake/low/__init__.py": "from fake.low.core import helper\n",
        "fake/low/core.py": ("def helper():\n    return 1\n\n\ndef _secret():\n    return 2\n\n\n_hidden = 3\n\n\n"
                             "def uses_high():\n    from ..high import api  # upward, function-local\n"
                             "    return api.run()\n"),
        "fake/high/__init__.py": "",
        "fake/high/api.py": ("import fake.low.core as core\nfrom fake.low import helper  # downward: fine\n"
                             "from fake.low.core import _secret\n\n\n"
                             "def run():\n    return _secret() + core._hidden\n"),
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    imports = collect_imports(((tmp_path / "fake", "fake"),), tmp_path)
    found = find_violations(imports, (("fake.high",), ("fake.low",)))
    assert set(found) == {
        "upward: fake.low.core -> fake.high.api (function-local)",
        "cycle: fake.high, fake.low",
        "private: fake.high.api -> fake.low.core._secret",
        "private: fake.high.api -> fake.low.core._hidden",
    }
    assert found["upward: fake.low.core -> fake.high.api (function-local)"].startswith(
        "fake/low/core.py:13 imports fake.high.api")
    assert "fake.low -> fake.high: fake/low/core.py:13 imports fake.high.api (function-local)   UPWARD" in found[
        "cycle: fake.high, fake.low"]
    # Reversing the floors turns the downward imports into the upward ones, and a package on no floor is named.
    reversed_found = find_violations(imports, (("fake.low",), ("fake.high",)))
    assert "upward: fake.high.api -> fake.low.core (top-level)" in reversed_found
    assert "unplaced: fake.low" in find_violations(imports, (("fake.high",),))


def _print_known() -> None:
    """Today's violations as KNOWN's entries, keeping the reasons already written."""
    print("KNOWN = {")
    for key in sorted(current_violations()):
        reason = KNOWN.get(key, "TODO: why it is there, and what removes it")
        print(f"    {_literal(key, 8)}:\n        {_literal(reason, 8)},")
    print("}")


def _literal(text: str, indent: int) -> str:
    """``text`` as a Python string literal, split into adjacent literals of at most 100 characters."""
    lines = textwrap.wrap(text, 100, break_long_words=False, break_on_hyphens=False)
    if len(lines) == 1:
        return repr(text)
    parts = [repr(line + " ") for line in lines[:-1]] + [repr(lines[-1])]
    return "(" + ("\n" + " " * (indent + 1)).join(parts) + ")"


if __name__ == "__main__":
    if "--print-known" in sys.argv[1:]:
        _print_known()
    else:
        for key, message in sorted(current_violations().items()):
            print(f"{key}{'' if key in KNOWN else '   [NEW]'}\n{textwrap.indent(message, '    ')}\n")
