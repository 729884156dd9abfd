"""The extras install what they serve, and a missing one is named exactly.

``fairq[server]`` must install every third-party module that the server's code imports
(read off the import statements of everything ``fairq serve`` can load, lazily loaded
modules included), with the dependencies of those requirements resolved from the
installed packages' own metadata, as pip would. ``fairq[all]`` names every extra. The
clean-venv test (``tests/acceptance/test_wheel.py``) checks the same by installing the
wheel.
"""

from __future__ import annotations

import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from test_layers import all_imports
from typer.testing import CliRunner

import fairq
from fairq.extras import MissingExtra

ROOT = Path(fairq.__file__).parent
PROJECT = tomllib.loads((ROOT.parents[1] / "pyproject.toml").read_text())["project"]
EXTRAS: dict[str, list[str]] = PROJECT["optional-dependencies"]
#: where `fairq serve` starts loading code; everything they import is followed
SERVER_ROOTS = ("fairq.http.serve", "fairq.http.app", "fairq.http.rooms", "fairq.worker")
#: modules with an extra of their own, never loaded by the server on its default backend
NOT_FOLLOWED = ("fairq.cli", "fairq.demo", "fairq.backends.redis", "fairq.backends.postgres",
                "fairq.backends.amqp")  # fmt: skip


def _path(module: str) -> Path | None:
    base = ROOT.parent / module.replace(".", "/")
    for p in (base.with_suffix(".py"), base / "__init__.py"):
        if p.exists():
            return p
    return None


def third_party_imports(roots: tuple[str, ...]) -> dict[str, str]:
    """Top-level third-party module -> a fairq module importing it, over the closure of
    ``roots``' imports (every statement: top level, in functions, under TYPE_CHECKING)."""
    seen: set[str] = set()
    todo = list(roots)
    found: dict[str, str] = {}
    while todo:
        module = todo.pop()
        if module in seen or module.startswith(NOT_FOLLOWED):
            continue
        seen.add(module)
        path = _path(module)
        if path is None:
            continue
        for name in all_imports(path):
            top = name.split(".")[0]
            if top == "fairq":
                todo.append(name)
                # `from .x import y`: the package x itself is loaded on the way
                todo.extend(".".join(name.split(".")[:i]) for i in range(2, name.count(".") + 1))
            elif top and top not in sys.stdlib_module_names and top != "__future__":
                found.setdefault(top, module)
    return found


def installed_by(requirements: list[str]) -> set[str]:
    """Every distribution that installing ``requirements`` brings, resolved through the
    installed packages' metadata (extras such as ``PyJWT[crypto]`` included)."""
    out: set[str] = set()
    todo = [(Requirement(r), "") for r in requirements]
    while todo:
        req, extra = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": extra}):
            continue
        name = canonicalize_name(req.name)
        key = f"{name}[{','.join(sorted(req.extras))}]"
        if key in out:
            continue
        out.add(key)
        out.add(name)
        for raw in metadata.requires(req.name) or []:
            sub = Requirement(raw)
            for wanted in sorted(req.extras) or [""]:
                todo.append((sub, wanted))
    return {n for n in out if "[" not in n}


def test_server_extra_installs_every_module_the_server_imports() -> None:
    found = third_party_imports(SERVER_ROOTS)
    # the walk reads what it should: these are imported by the app, the rooms and tokens
    assert {"starlette", "uvicorn", "msgspec", "jwt", "cryptography", "httpx"} <= set(found)
    dists = installed_by(PROJECT["dependencies"] + EXTRAS["server"])
    providers = metadata.packages_distributions()
    missing = {
        f"{top} (imported by {module}, from {', '.join(providers.get(top, ['?']))})"
        for top, module in found.items()
        if not {canonicalize_name(d) for d in providers.get(top, [])} & dists
    }
    assert not missing, "fairq[server] does not install:\n" + "\n".join(sorted(missing))


def test_the_core_alone_does_not_bring_the_server() -> None:
    """The check above can fail: without the extra, the server's modules are missing."""
    dists = installed_by(PROJECT["dependencies"])
    assert "starlette" not in dists and "pyjwt" not in dists and "typer" in dists


def test_all_installs_every_extra() -> None:
    (everything,) = EXTRAS["all"]
    req = Requirement(everything)
    assert canonicalize_name(req.name) == "fairq"
    assert req.extras == set(EXTRAS) - {"all"}


def test_serve_without_the_server_extra_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """`pip install fairq` then `fairq serve`: the error names `fairq[server]` (it once
    printed `pip install 'fairq'`, the console having eaten `[server]` as markup)."""
    from fairq.cli import app

    monkeypatch.setitem(sys.modules, "fairq.http.serve", None)  # as if starlette were absent
    result = CliRunner().invoke(app, ["serve"])
    assert result.exit_code == 2
    assert "pip install 'fairq[server]'" in result.output


def test_a_missing_extra_is_named_with_its_cause() -> None:
    cause = ModuleNotFoundError("No module named 'jwt'", name="jwt")
    exc = MissingExtra("waiting rooms need PyJWT and cryptography", "room", cause)
    assert isinstance(exc, ImportError) and exc.extra == "room" and exc.name == "jwt"
    assert str(exc) == (
        "waiting rooms need PyJWT and cryptography: pip install 'fairq[room]' "
        "(No module named 'jwt')"
    )
