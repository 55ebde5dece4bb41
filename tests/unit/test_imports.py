"""The import contract, read from the source (ast): cli -> hooks -> features -> job/osl/slurm.

- the base (``wrapper.job``, ``wrapper.osl``, ``wrapper.slurm``) never imports a hook, a
  feature or the CLI;
- features never import a hook or the CLI (the hooks call them, not the reverse);
- nothing imports another package's private (``_x``) name.
See docs/architecture.md.
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
