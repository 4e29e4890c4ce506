"""memstaged run as ``nobody``, for the tests about permissions (root would bypass them).

``nobody`` must reach an interpreter, memstaged and its dependencies, and the test's own venv
may sit where it cannot: a clone under ``/root`` or under a 0700 ``mktemp -d``, a Python under
pyenv in ``/root`` (setpriv, still holding root's capabilities while it execs, starts such a
Python, which then cannot read its own library). So, once per session, a venv of its own is
built under ``/tmp`` for it: the first interpreter of this Python's version that ``nobody`` can
run, a copy of the memstaged package under test and of the distributions it depends on. Every
test that drops to ``nobody`` runs memstaged through :func:`run_memstaged`, in a directory made
by :func:`workspace`, so it works wherever the clone is.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import importlib.metadata
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from packaging.requirements import Requirement

import memstaged

#: Where ``nobody`` is sure to get: the workspaces and the venv live here, not under ``$TMPDIR``.
_SHARED_TMP = "/tmp"
#: Where a system's own Python is, when this one is not usable by ``nobody``.
_SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"
#: What the child must not inherit: another interpreter's search path.
_PYTHON_VARIABLES = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV")


def ids() -> tuple[int, int]:
    """``nobody``'s uid and gid, to give it what a test makes; a skip where memstaged cannot be
    run as ``nobody`` here (not root, no setpriv, no such user)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to run memstaged as another user; this test runs as non-root")
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv is not installed: cannot drop privileges for this test")
    return owner_ids()


def owner_ids() -> tuple[int, int]:
    """``nobody``'s uid and gid, to give it a file or directory (nothing is run as ``nobody``);
    a skip unless this test may (root) and there is such a user."""
    if os.geteuid() != 0:
        pytest.skip("needs root to give a directory to another user")
    try:
        user = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("there is no user nobody")
    return user.pw_uid, user.pw_gid


def made_by(path: Path, uid: int, mode: int = 0o755) -> Path:
    """``path`` made by another user first (a directory owned by ``uid``, with ``mode``)."""
    path.mkdir()
    os.chown(path, uid, uid)
    os.chmod(path, mode)
    return path


def _drop() -> list[str]:
    """The prefix that runs a command as ``nobody``, with no supplementary group."""
    uid, gid = ids()
    return ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--"]


def _runs_for_nobody(python: str) -> bool:
    """``nobody`` can start ``python`` by its path (through ``sh``: setpriv would exec it with
    root's capabilities still held) and it is this Python's version, so that the compiled
    dependencies copied for it load."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    probe = "import sys; print('%d.%d' % sys.version_info[:2])"
    try:
        result = subprocess.run(
            [*_drop(), "sh", "-c", 'exec "$0" -I -c "$1"', python, probe],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            cwd="/",
            env={"PATH": _SYSTEM_PATH, "LC_ALL": "C"},
        )
    except subprocess.TimeoutExpired:
        return False
    return result.returncode == 0 and result.stdout.strip() == version


def _interpreter() -> str:
    """This Python's own interpreter if ``nobody`` can run it, else the system's of the same
    version; a skip, saying so, when there is neither."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    base = getattr(sys, "_base_executable", sys.executable)
    candidates = [os.path.realpath(base)]
    system = shutil.which(f"python{version}", path=_SYSTEM_PATH)
    if system is not None:
        candidates.append(system)
    for python in dict.fromkeys(candidates):
        if _runs_for_nobody(python):
            return python
    pytest.skip(f"no Python {version} that nobody may run (tried {', '.join(candidates)})")


def _runtime_distributions() -> list[importlib.metadata.Distribution]:
    """The distributions memstaged needs to run (its requirements, and theirs), not the extras."""
    found: dict[str, importlib.metadata.Distribution] = {}
    todo = list(importlib.metadata.distribution("memstaged").requires or [])
    while todo:
        requirement = Requirement(todo.pop())
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        name = requirement.name.lower().replace("_", "-")
        if name in found:
            continue
        found[name] = dist = importlib.metadata.distribution(requirement.name)
        todo.extend(dist.requires or [])
    return list(found.values())


def _copy_distribution(dist: importlib.metadata.Distribution, site: Path) -> None:
    """The files a distribution installed into site-packages (not its scripts), into ``site``."""
    for file in dist.files or []:
        if file.parts[0] == ".." or "__pycache__" in file.parts:
            continue
        target = site / file
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(str(dist.locate_file(file)), target)


@functools.cache
def _python() -> str:
    """The venv's interpreter, built once per session and removed when the session ends."""
    interpreter = _interpreter()
    root = Path(tempfile.mkdtemp(prefix="memstaged-nobody-venv-", dir=_SHARED_TMP))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    os.chmod(root, 0o755)  # noqa: S103 - nobody must reach the venv inside
    venv = root / "venv"
    subprocess.run(
        [interpreter, "-I", "-m", "venv", "--without-pip", "--symlinks", str(venv)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    python = venv / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(python), "-I", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
            check=True,
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout.strip()
    )
    for dist in _runtime_distributions():
        _copy_distribution(dist, site)
    package = Path(memstaged.__file__).parent  # the code under test, wherever it is installed
    shutil.copytree(package, site / "memstaged", ignore=shutil.ignore_patterns("__pycache__"))
    return str(python)


@contextlib.contextmanager
def workspace(prefix: str) -> Iterator[Path]:
    """A directory under ``/tmp`` that ``nobody`` can reach (a test's ``tmp_path``, or
    ``$TMPDIR``, may not be), mode 0755, removed afterwards."""
    base = Path(tempfile.mkdtemp(prefix=prefix, dir=_SHARED_TMP))
    try:
        os.chmod(base, 0o755)  # noqa: S103 - nobody must reach what the test puts inside
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def run_memstaged(
    *args: str, env: dict[str, str], cwd: Path, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """``memstaged ARGS`` as ``nobody``, from the venv it can reach (skips where no user can be
    dropped to, or no interpreter is there for it)."""
    command = [*_drop(), _python(), "-m", "memstaged", *args]
    child_env = {k: v for k, v in env.items() if k not in _PYTHON_VARIABLES}
    return subprocess.run(
        command,
        env=child_env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=cwd,
    )


def run_as_nobody(*command: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``command`` (a system tool such as ``cat``) as ``nobody``, with no supplementary group:
    what another user, a collector, may do with a file (skips where no user can be dropped to)."""
    return subprocess.run(
        [*_drop(), *command],
        env={"PATH": _SYSTEM_PATH, "LC_ALL": "C"},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd="/",
    )
