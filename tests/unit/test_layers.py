"""The package's layers, read off its import statements (every one: top level, inside
functions and under ``TYPE_CHECKING``).

The seam stands alone: ``fairq.backends`` and the value types of ``fairq.model`` import
nothing from the handle modules (queue, pubsub, attention, idempotency, waitingroom,
broker, worker ...) that speak to them, so an engine is written against ``base.py``,
``rules.py``, the policies and ``fairq.model`` alone. Data flows one way: user code ->
handle -> backend -> engine.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import fairq

ROOT = Path(fairq.__file__).parent
#: modules above the seam: they build on backends, never the other way round
HANDLES = (
    "fairq.queue",
    "fairq.pubsub",
    "fairq.attention",
    "fairq.idempotency",
    "fairq.waitingroom",
    "fairq.broker",
    "fairq.sync",
    "fairq.worker",
    "fairq.http",
    "fairq.cli",
    "fairq.demo",
    "fairq.push",
    "fairq.adaptive",
)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: Path) -> set[str]:
    """Every fairq module ``path`` imports, relative imports resolved."""
    return {m for m in all_imports(path) if m == "fairq" or m.startswith("fairq.")}


def all_imports(path: Path) -> set[str]:
    """Every module ``path`` imports (third-party ones too), relative imports resolved."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{a.name}" for a in node.names)  # `from . import x`
    return found


def modules_under(*packages: str) -> list[Path]:
    return sorted(
        p for pkg in packages for p in (ROOT / pkg.replace(".", "/")).rglob("*.py")
    ) or pytest.fail(f"no modules under {packages}")


def above_the_seam(module: str) -> bool:
    return any(module == h or module.startswith(h + ".") for h in HANDLES)


@pytest.mark.parametrize("layer", ["backends", "model"])
def test_layer_imports_nothing_above_the_seam(layer: str) -> None:
    offending = {
        f"{module_name(p)} -> {m}"
        for p in modules_under(layer)
        for m in imports(p)
        if above_the_seam(m) or m == "fairq"
    }
    assert not offending, "imports from above the seam:\n" + "\n".join(sorted(offending))


def test_model_does_not_import_backends() -> None:
    offending = {
        f"{module_name(p)} -> {m}"
        for p in modules_under("model")
        for m in imports(p)
        if m.startswith("fairq.backends")
    }
    assert not offending, "\n".join(sorted(offending))


def test_the_walk_sees_imports() -> None:
    """The checks above cannot pass by reading nothing: a handle's imports are found."""
    found = imports(ROOT / "queue.py")
    assert "fairq.model.queues" in found and "fairq.backends.base" in found
