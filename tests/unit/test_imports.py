"""The import contract, read from the source (ast): cli -> hooks -> features -> job/osl/slurm.

Every module of ``wrapper/`` sits in one layer of :data:`LAYERS`; none imports a module
of a higher layer (lazy imports inside functions count too), packages import each other
in no loop, and neither do the modules inside a package.

- the base (``wrapper.job``, ``wrapper.osl``, ``wrapper.slurm``) never imports a hook, a
  feature or the CLI;
- features never import a hook or the CLI (the hooks call them, not the reverse);
- nothing imports another package's private (``_x``) name.
See docs/architecture.md.

The tests keep one rule of their own: no module of ``tests/`` imports a test module
(``test_*.py``). Set-up two test modules share is a fixture in the nearest conftest.py;
a pure helper or constant is in the ``tests/support`` package.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "wrapper"
BASE = ("wrapper.job", "wrapper.osl", "wrapper.slurm")
FEATURES = ("wrapper.restart", "wrapper.staging", "wrapper.archive", "wrapper.checkpoints",
            "wrapper.supervisor", "wrapper.gpu")
UPPER = ("wrapper.hooks", "wrapper.cli")


def modules() -> Iterator[tuple[str, ast.Module]]:
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        yield name, ast.parse(path.read_text(), str(path))


def imports(tree: ast.Module) -> Iterator[tuple[str, str]]:
    """(module, name) for every ``from M import name`` and (module, "") for ``import M``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                yield node.module, alias.name
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, ""


def within(name: str, packages: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


def top(name: str) -> str:
    return ".".join(name.split(".")[:2])


def test_the_base_imports_no_hook_feature_or_cli() -> None:
    bad = [f"{mod} imports {target}" for mod, tree in modules() if within(mod, BASE)
           for target, name in imports(tree)
           if within(f"{target}.{name}" if name else target, FEATURES + UPPER)
           or within(target, FEATURES + UPPER)]
    assert bad == []


def test_features_import_no_hook_or_cli() -> None:
    bad = [f"{mod} imports {target}" for mod, tree in modules() if within(mod, FEATURES)
           for target, _name in imports(tree) if within(target, UPPER)]
    assert bad == []


def test_no_module_imports_another_packages_private_names() -> None:
    bad = [f"{mod} imports {target}.{name}" for mod, tree in modules()
           for target, name in imports(tree)
           if name.startswith("_") and not name.startswith("__")
           and target.startswith("wrapper")
           and top(target) != top(mod)]
    assert bad == []


def test_the_checker_sees_a_violation() -> None:
    tree = ast.parse("from wrapper.hooks.epilog import run\nfrom wrapper.x import _y\n")
    assert list(imports(tree)) == [("wrapper.hooks.epilog", "run"), ("wrapper.x", "_y")]
    assert within("wrapper.hooks.epilog", UPPER) and not within("wrapper.hookshot", UPPER)


# Lowest first. A new module must be placed here: the test below fails on one that is not.
LAYERS: tuple[tuple[str, ...], ...] = (
    # the ground: no jobwrap concept of its own
    ("wrapper.errors", "wrapper.fastdataclass", "wrapper.log", "wrapper.config", "wrapper.runner",
     "wrapper.osl", "wrapper.submit"),
    # a job's state, Slurm, starting a detached process
    ("wrapper.job", "wrapper.slurm", "wrapper.detach"),
    # the features the hooks and commands call
    ("wrapper.restart", "wrapper.staging", "wrapper.archive",
     "wrapper.checkpoints", "wrapper.supervisor", "wrapper.gpu", "wrapper.watch",
     "wrapper.pulse",
     "wrapper.goodput", "wrapper.metrics", "wrapper.notify", "wrapper.loginguard"),
    # the entry points
    ("wrapper.hooks", "wrapper.cli", "wrapper.doctor", "wrapper.entry",
     "wrapper.__main__", "wrapper.install"),
)


def test_the_shipped_package_needs_no_development_tool() -> None:
    """The wheel holds ``wrapper`` alone (pyproject's find ``include``): no module of it may
    import the sandbox or the docs generator (``jobwrap_dev``), lazily or not."""
    import tomllib

    found = [(mod, name) for mod, tree in modules() for name, _ in imports(tree)
             if name == "jobwrap_dev" or name.startswith("jobwrap_dev.")]
    assert found == []
    project = tomllib.loads((ROOT.parent / "pyproject.toml").read_text())
    assert project["tool"]["setuptools"]["packages"]["find"]["include"] == ["wrapper*"]


def layer_of(name: str) -> int | None:
    return next((i for i, packages in enumerate(LAYERS) if within(name, packages)), None)


def test_every_module_has_a_layer_and_imports_none_above_it() -> None:
    unplaced = [mod for mod, _tree in modules() if mod != "wrapper" and layer_of(mod) is None]
    assert unplaced == [], "place these in LAYERS (tests/unit/test_imports.py)"
    upward = []
    for mod, tree in modules():
        here = layer_of(mod)
        for target, name in imports(tree):
            if not target.startswith("wrapper."):
                continue
            there = layer_of(f"{target}.{name}" if name else target)
            there = layer_of(target) if there is None else there
            if here is not None and there is not None and there > here:
                upward.append(f"{mod} imports {target}")
    assert upward == []


def package_loops(edges: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected groups of more than one package (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    loops: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(edges.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                group.add(member)
                if member == node:
                    break
            if len(group) > 1:
                loops.append(group)

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return loops


def test_packages_import_each_other_in_no_loop() -> None:
    edges: dict[str, set[str]] = {}
    for mod, tree in modules():
        for target, name in imports(tree):
            full = f"{target}.{name}" if target == "wrapper" and name else target
            if full.startswith("wrapper.") and top(full) != top(mod):
                edges.setdefault(top(mod), set()).add(top(full))
    assert package_loops(edges) == []


def test_the_loop_finder_finds_a_loop() -> None:
    assert package_loops({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]
    assert package_loops({"a": {"b"}, "b": set()}) == []


def module_edges(trees: dict[str, ast.Module]) -> dict[str, set[str]]:
    """Module -> the modules among ``trees`` it imports, wherever the import stands (in a
    function, under TYPE_CHECKING): ``from P import n`` imports ``P.n`` when that is a
    module, else ``P`` (a package's ``__init__``)."""
    edges: dict[str, set[str]] = {}
    for mod, tree in trees.items():
        for target, name in imports(tree):
            full = f"{target}.{name}" if name and f"{target}.{name}" in trees else target
            if full in trees and full != mod:
                edges.setdefault(mod, set()).add(full)
    return edges


# Loops that wait on code another change holds: each names its way out. Remove the entry
# with the loop (the test fails on a listed loop that is gone, so the list stays true).
WAITING: list[set[str]] = []


def test_modules_import_each_other_in_no_loop() -> None:
    """Inside a package too, no module imports (even lazily) one that imports it back:
    what two modules share goes down to the one it belongs in, or to a small new one."""
    loops = package_loops(module_edges(dict(modules())))
    assert [sorted(loop) for loop in loops if loop not in WAITING] == []
    assert [sorted(loop) for loop in WAITING if loop not in loops] == [], \
        "this loop is gone: take it off WAITING"


def test_the_module_loop_finder_sees_lazy_imports_and_submodules() -> None:
    trees = {name: ast.parse(source) for name, source in {
        "p": "",
        "p.a": "from p import b\n",
        "p.b": "def f():\n    from p.a import x\n",
        "p.c": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import p.d\n",
        "p.d": "from p.c import y\n",
        "p.e": "from p import thing\n",
    }.items()}
    assert module_edges(trees) == {"p.a": {"p.b"}, "p.b": {"p.a"}, "p.c": {"p.d"},
                                   "p.d": {"p.c"}, "p.e": {"p"}}
    assert sorted(map(sorted, package_loops(module_edges(trees)))) == [["p.a", "p.b"],
                                                                      ["p.c", "p.d"]]


# -- the tests' own rule: no module imports a test module ------------------------------------
TESTS = ROOT.parent / "tests"


def dotted(path: Path) -> str:
    """The module name of a file below the checkout (``tests.unit.job.test_upgrades``)."""
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(name: str, is_package: bool, tree: ast.Module) -> Iterator[tuple[int, str]]:
    """(line, module or module.name) for every import the module ``name`` makes (lazy ones
    too), relative ones resolved against its package: ``from tests.x import test_y``
    yields ``tests.x`` and ``tests.x.test_y``, for the name may be a module."""
    package = name.split(".") if is_package else name.split(".")[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            if module:
                yield node.lineno, module
            for alias in node.names:
                yield node.lineno, f"{module}.{alias.name}" if module else alias.name
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name


def imports_of_test_modules(files: dict[Path, str]) -> list[str]:
    """``path:line imports tests.x.test_y`` for each import of a test module among
    ``files`` (path -> source), by any of them."""
    names = {dotted(path): path for path in files}
    test_modules = {name for name, path in names.items() if path.name.startswith("test_")}
    found = set()
    for name, path in names.items():
        tree = ast.parse(files[path], str(path))
        for line, target in imported(name, path.name == "__init__.py", tree):
            if target in test_modules and target != name:
                found.add((str(path.relative_to(ROOT.parent)), line, target))
    return [f"{path}:{line} imports {target}" for path, line, target in sorted(found)]


def test_no_module_of_the_tests_imports_a_test_module() -> None:
    files = {path: path.read_text() for path in sorted(TESTS.rglob("*.py"))}
    found = imports_of_test_modules(files)
    assert found == [], "\n".join([
        "these import a test module; move what they share: set-up to a fixture in the "
        "nearest conftest.py, a pure helper or constant to tests/support/", *found])


def test_the_test_import_checker_sees_every_form() -> None:
    unit = TESTS / "unit"
    files = {
        unit / "a" / "__init__.py": "from . import test_one\n",
        unit / "a" / "test_one.py": "from tests.unit.b.test_two import helper\n",
        unit / "a" / "test_three.py": "def f():\n    from .test_one import x\n",
        unit / "a" / "conftest.py": "import tests.unit.b.test_two as two\n",
        unit / "b" / "test_two.py": "from ..a import test_one\nfrom tests.support import x\n",
        unit / "b" / "conftest.py": "from tests.unit.b import helpers\n",
    }
    assert imports_of_test_modules(files) == [
        "tests/unit/a/__init__.py:1 imports tests.unit.a.test_one",
        "tests/unit/a/conftest.py:1 imports tests.unit.b.test_two",
        "tests/unit/a/test_one.py:1 imports tests.unit.b.test_two",
        "tests/unit/a/test_three.py:2 imports tests.unit.a.test_one",
        "tests/unit/b/test_two.py:1 imports tests.unit.a.test_one",
    ]
