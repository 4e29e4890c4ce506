"""The package's layout keeps its promises (docs/architecture.md): each wing imports only the
wings below it, ``core/`` is pure, and only ``files/`` opens, creates, renames, links or removes.

Read from the sources with :mod:`ast`, as written: an import made inside a function counts,
and so does one under ``TYPE_CHECKING``, but in ``errors``: the exceptions of the file layer's
transaction carry its types, which ``errors`` names for the type checker alone (at run time it
imports nothing of memstaged's, so every wing may import it).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest

import memstaged

PACKAGE: Final = Path(memstaged.__file__).parent
#: The wings, lowest first: a module may import its own wing and those before it.
WINGS: Final = (
    "core",
    "files",
    "log",
    "config_file",
    "config",
    "run",
    "deadletter",
    "daemon",
    "cli",
)
#: Modules anyone may import: they import nothing of memstaged's but each other.
LEAVES: Final = frozenset({"memstaged", "errors", "safe_text", "durations", "patience"})
#: What only ``files/`` may call: each creates, renames, links, removes or changes the mode of
#: a file (``os.X``, ``shutil.X``, and the methods of the same name of ``Path`` or a socket).
CHANGES: Final = frozenset(
    {
        "rename",
        "renames",
        "link",
        "symlink",
        "unlink",
        "remove",
        "rmdir",
        "mkdir",
        "makedirs",
        "rmtree",
        "chmod",
        "fchmod",
        "chown",
        "write_text",
        "write_bytes",
        "symlink_to",
        "hardlink_to",
        "mkfifo",
        "bind",
        "copyfile",
        "move",
    }
)
#: Method names that are not file changes on the objects that have them (``list.remove``,
#: ``set.remove``): a call is a change only as ``os.X``/``shutil.X`` or on a path.
_AMBIGUOUS: Final = frozenset({"remove", "move"})


def _wing(module: str) -> str:
    """``memstaged.files.fsio`` -> ``files``; ``memstaged.config`` -> ``config``; a name of the
    package itself (``memstaged.__version__``) -> ``memstaged``."""
    parts = module.split(".")
    if len(parts) == 1:
        return "memstaged"
    top = parts[1]
    is_module = (PACKAGE / top).is_dir() or (PACKAGE / f"{top}.py").is_file()
    return top if is_module else "memstaged"


def _modules() -> Iterator[tuple[str, Path, ast.Module]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        dotted = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        yield dotted.removesuffix(".__init__"), path, ast.parse(path.read_bytes(), str(path))


def _imports(tree: ast.Module) -> Iterator[tuple[int, str]]:
    """Every memstaged module ``tree`` imports (a name imported from a package may be one)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "memstaged":
                    yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            if node.module.split(".")[0] != "memstaged":
                continue
            if node.module == "memstaged":
                for alias in node.names:
                    yield node.lineno, f"memstaged.{alias.name}"
            else:
                yield node.lineno, node.module


def _where(path: Path, line: int) -> str:
    return f"{path.relative_to(PACKAGE.parent)}:{line}"


def _typing_only(tree: ast.Module) -> set[int]:
    """The lines of the imports under a module-level ``if TYPE_CHECKING:``."""
    lines = set()
    for node in tree.body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            lines |= {n.lineno for n in ast.walk(node) if isinstance(n, ast.ImportFrom)}
    return lines


def arrows_broken() -> list[str]:
    """Imports of a wing above the importer's (``core/``: of anything but itself and errors)."""
    broken = []
    for module, path, tree in _modules():
        own = _wing(module)
        named_only = _typing_only(tree) if own == "errors" else set()
        for line, target in _imports(tree):
            if line in named_only and _wing(target) == "files":
                continue
            wing = _wing(target)
            if wing == own or (own in LEAVES - {"memstaged"} and wing in LEAVES):
                continue
            if own == "core":
                allowed = wing == "errors"
            elif own in ("memstaged", "__main__"):
                allowed = True  # the package's face: ``decide`` on first use; ``-m`` runs the CLI
            elif own in LEAVES:
                allowed = False
            else:
                allowed = wing in LEAVES or WINGS.index(wing) < WINGS.index(own)
            if not allowed:
                broken.append(f"{_where(path, line)}: {module} imports {target}")
    return broken


def _called(node: ast.Call) -> tuple[str | None, str | None]:
    """``os.rename(…)`` -> ("os", "rename"); ``p.unlink()`` -> ("p", "unlink"); ``open(…)``
    -> (None, "open")."""
    func = node.func
    if isinstance(func, ast.Name):
        return None, func.id
    if isinstance(func, ast.Attribute):
        owner = func.value.id if isinstance(func.value, ast.Name) else None
        return owner, func.attr
    return None, None


def disk_touched_outside_files() -> list[str]:
    """Calls outside ``files/`` that open a file or change one (:data:`CHANGES`)."""
    found = []
    for module, path, tree in _modules():
        if _wing(module) == "files":
            continue
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            owner, name = _called(node)
            opens = (owner is None and name == "open") or (owner == "os" and name == "open")
            changes = (
                name in CHANGES
                and owner != "fsio"  # the file layer's own functions, by their names
                and (name not in _AMBIGUOUS or owner in ("os", "shutil"))
            )
            if opens or changes:
                what = f"{owner}.{name}" if owner else name
                found.append(f"{_where(path, node.lineno)}: {module} calls {what}()")
    return found


def test_each_wing_imports_only_the_wings_below_it() -> None:
    """docs/architecture.md's arrows: a module imports its own wing, the wings below it and the
    leaves (errors, safe_text, durations); ``core/`` imports itself and ``errors`` alone."""
    assert arrows_broken() == []


def test_only_the_file_layer_opens_creates_renames_links_or_removes() -> None:
    """Every open, and every creation, rename, link, removal or change of mode, is made by
    ``files/``: its safe open, its private directories, its one writer; no other wing touches
    the disk on its own."""
    assert disk_touched_outside_files() == []


def test_the_wings_packages_are_empty() -> None:
    """Importing a wing imports nothing of it: a command loads only the modules it runs."""
    for init in sorted(PACKAGE.glob("*/**/__init__.py")):
        assert init.read_text() == "", init


@pytest.mark.parametrize(
    ("module", "line", "rule"),
    [
        ("core/decide.py", "from memstaged.files import fsio\n", arrows_broken),
        ("errors.py", "from memstaged.files import fsio\n", arrows_broken),
        ("errors.py", "if TYPE_CHECKING:\n    from memstaged.run import once\n", arrows_broken),
        ("files/plan.py", "from memstaged.run import pipeline\n", arrows_broken),
        ("run/once.py", "from memstaged.daemon import loop\n", arrows_broken),
        ("core/schema.py", "def _f() -> None:\n    open('x')\n", disk_touched_outside_files),
        ("run/pipeline.py", "def _f(p) -> None:\n    p.unlink()\n", disk_touched_outside_files),
        ("log/writer.py", "import os\nos.rename('a', 'b')\n", disk_touched_outside_files),
    ],
    ids=lambda v: v if isinstance(v, str) and v.endswith(".py") else "",
)
def test_each_rule_sees_a_module_that_breaks_it(
    module: str, line: str, rule: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checks above can fail: a break of each boundary, appended to a module as read, is
    found and named."""
    target = PACKAGE / module
    parse = ast.parse

    def with_break(source: bytes | str, filename: str = "<unknown>", *a: object) -> ast.Module:
        if Path(filename) == target:
            source = (source if isinstance(source, str) else source.decode()) + "\n" + line
        return parse(source, filename)

    monkeypatch.setattr(ast, "parse", with_break)
    assert callable(rule)
    found = rule()
    assert any(module in f for f in found), found
