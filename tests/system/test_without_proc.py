"""``--once`` where ``/proc`` is not mounted (a container or a chroot that lacks it): real
processes in a mount namespace of their own whose ``/proc`` is unmounted, under a real
descriptor limit. Skipped where a mount namespace cannot be made (not root, no ``unshare``)."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.helpers import (
    KINDS,
    REPO,
    check_final,
    make_corpus,
    make_memory_dir,
    memstaged_cmd,
    memstaged_env,
    project_root_of,
    write_inputs,
)

#: Every kind of file but the 2,000-deep one (whose records the checks read back with ``json``).
_KINDS = tuple(k for k in KINDS if k != "deep")
#: Started where /proc is gone: opens ``argv[1]`` descriptors on /dev/null, left to the program
#: it then becomes (``argv[2:]``), as a caller may leave them.
_INHERIT = """
import os, sys
fds = [os.open(os.devnull, os.O_RDONLY) for _ in range(int(sys.argv[1]))]
for fd in fds:
    os.set_inheritable(fd, True)
os.execv(sys.argv[2], sys.argv[2:])
"""


def _without_proc(*command: str) -> list[str]:
    return [
        "unshare",
        "-m",
        "--propagation",
        "private",
        "sh",
        "-c",
        'umount -l /proc && exec "$@"',
        "sh",
        *command,
    ]


def test_once_without_proc_decides_every_file_under_a_low_descriptor_limit(tmp_path: Path) -> None:
    """Without ``/proc``, an unnamed temp could not be linked into place (``/proc/self/fd``):
    every repair and quarantine was deferred, run after run, and the descriptors open could not
    be counted: 300 inherited under a limit of 1,024 with 32 workers ran out (``Too many open
    files``). Every file is decided (named temps instead; the descriptors counted one by one),
    exit 0, and the disk is as SPEC says."""
    if shutil.which("unshare") is None or shutil.which("prlimit") is None:
        pytest.skip("unshare or prlimit is missing: no mount namespace without /proc here")
    probe = subprocess.run(_without_proc("true"), capture_output=True, check=False, timeout=30)
    if probe.returncode != 0:
        pytest.skip(f"no mount namespace without /proc here: {probe.stderr.decode().strip()}")
    mdir = make_memory_dir(tmp_path)
    inputs = make_corpus(random.Random(11), 2000, project_root_of(mdir), "np-", kinds=_KINDS)
    write_inputs(mdir / "staging", inputs)
    env = memstaged_env(tmp_path, MEMSTAGED_WORKERS="32")
    args = memstaged_cmd("--once", "--memory-dir", str(mdir))
    done = subprocess.run(
        [
            "prlimit",
            "--nofile=1024:1024",
            *_without_proc(sys.executable, "-c", _INHERIT, "300", *args),
        ],
        env=env,
        capture_output=True,
        timeout=300,
        check=False,
        cwd=REPO,
    )
    stderr = done.stderr.decode(errors="replace")
    assert "Traceback" not in stderr
    assert done.returncode == 0, stderr[-2000:]
    log = Path(env["MEMSTAGED_LOG_FILE"]).read_text()
    assert "Too many open files" not in log
    deferred = [e for e in map(json.loads, log.splitlines()) if e.get("decision") == "deferred"]
    assert deferred == [], deferred[:2]
    assert check_final(mdir, inputs) == []
