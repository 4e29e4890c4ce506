"""The locks (:mod:`memstaged.files.locks`): what names a lock's holder as memstaged.

The instance lock and the reconciler's lock held by real processes are in
``tests/system/test_instance_lock.py`` and ``tests/system/test_reconciler_lock.py``."""

from __future__ import annotations

import os

import pytest

from memstaged.files.locks import runs_memstaged


@pytest.mark.parametrize(
    ("argv", "memstaged"),
    [
        (["/usr/bin/python3", "/home/u/.local/bin/memstaged", "--once"], True),
        (["/usr/bin/python3", "-I", "/usr/bin/memstaged"], True),
        (["/usr/bin/python3", "-X", "dev", "/usr/bin/memstaged"], True),
        (["python3", "-m", "memstaged", "status"], True),
        (["python3", "-mmemstaged"], True),
        (["memstaged", "--memory-dir", "x"], True),
        (["flock", "-x", "/home/u/p/.pi/memory/project", "cat"], False),
        (["python3", "-c", "import memstaged", "memstaged"], False),
        (["python3", "-m", "pytest", "tests/memstaged"], False),
        (["sleep", "memstaged"], False),
        ([], False),
    ],
)
def test_only_a_memstaged_command_line_is_memstaged(argv: list[str], memstaged: bool) -> None:
    """Issue 29 item 10: what names a lock's holder as memstaged is its command line running
    memstaged (the script, by itself or by its interpreter, or ``-m memstaged``)."""
    assert runs_memstaged([os.fsencode(a) for a in argv] + [b""]) is memstaged
