"""Which project a staging file belongs to (SPEC 2.4).

The root given is already physical (links resolved where the memory dirs are set up:
:func:`memstaged.files.memdir.physical_path`); a file's value is resolved against it lexically,
never through the file system, as Node's ``path.resolve`` does: a foreign file must be recognised as
such even when its project no longer exists, and links in the value are not followed.
"""

from __future__ import annotations

import posixpath

from memstaged.core.js.ecma import is_nonempty_string, trim


def normalize(path: str) -> str:
    """Lexical normalization: ``.``, ``..``, repeated and trailing slashes."""
    normal = posixpath.normpath(path)
    # normpath keeps exactly two leading slashes (POSIX leaves them implementation-defined).
    return "/" + normal.lstrip("/") if normal.startswith("//") else normal


def default_project_root(memory_dir: str) -> str:
    """``<project>`` in ``<project>/.pi/memory/project``: three levels up."""
    return normalize(posixpath.join(normalize(memory_dir), "..", "..", ".."))


def foreign_root(doc: object, project_root: str) -> str | None:
    """The other project a file names, or ``None`` when it is this project's (or names none)."""
    if not isinstance(doc, dict):
        return None
    value = doc.get("project_root")
    if not isinstance(value, str) or not is_nonempty_string(value):
        return None
    named = normalize(posixpath.join(project_root, trim(value)))
    return None if named == normalize(project_root) else named
