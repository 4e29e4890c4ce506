"""SPEC 2.4 (version 2.2): a file is foreign exactly when the reconciler takes it for another
project's, also when the project is reached through a symbolic link.

The reconciler works in its project's directory, takes ``process.cwd()`` (links resolved) as
its root and compares ``path.resolve(project_root)`` with it. Real Node answers for each value,
in a real project reached through a real link; real ``--once``, ``check`` and daemon runs of
memstaged configured through the link decide malformed files, so that a wrong "this project's"
would quarantine (move) a file of another project.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.decision_log import read_events
from support.documents import staging_doc, write
from support.helpers import (
    OLD_MTIME,
    PYTHON,
    daemon,
    make_memory_dir,
    memstaged_cmd,
    memstaged_env,
    run_once,
)
from support.node_oracle import Node
from support.terminal import terminal
from support.waiting import wait_for

#: The failure guard of every wait (each ends on the event it waits for).
GUARD = 60.0
MEMORY = Path(".pi") / "memory" / "project"


@pytest.fixture(scope="module")
def node() -> Iterator[Node]:
    oracle = Node()
    yield oracle
    oracle.close()


@dataclass(frozen=True)
class Linked:
    """A project at ``physical``, reached as ``reached`` through a symbolic link."""

    physical: Path
    reached: Path

    @property
    def memory_dir(self) -> Path:
        """The memory dir as memstaged is configured with it: through the link."""
        return self.reached / MEMORY

    @property
    def staging(self) -> Path:
        return self.physical / MEMORY / "staging"


@pytest.fixture(params=["linked parent", "linked project"])
def linked(request: pytest.FixtureRequest, tmp_path: Path) -> Linked:
    """``real/proj`` reached as ``link/proj`` (a link to ``real``), or as ``alias`` (a link to
    ``real/proj`` under another name, so ``../alias`` names another directory)."""
    base = Path(os.path.realpath(tmp_path))
    make_memory_dir(base / "real", "proj")
    physical = base / "real" / "proj"
    if request.param == "linked parent":
        (base / "link").symlink_to(base / "real", target_is_directory=True)
        return Linked(physical, base / "link" / "proj")
    (base / "alias").symlink_to(physical, target_is_directory=True)
    return Linked(physical, base / "alias")


def _values(linked: Linked) -> list[str]:
    """``project_root`` values that name the project, or nearly, every way a writer might."""
    parent = linked.reached.parent
    return [
        ".",
        "./",
        " . ",
        "..",
        f"../{linked.reached.name}",
        f"../{linked.physical.name}",
        str(linked.physical),
        f"{linked.physical}/",
        f"{linked.physical}/./",
        str(linked.reached),
        f"{linked.reached}/",
        f"{parent}/../{parent.name}/{linked.reached.name}",
        f"{linked.physical.parent}/../{linked.physical.parent.name}/{linked.physical.name}",
        f"//{str(linked.physical).lstrip('/')}",
    ]


def _malformed(root: str) -> dict[str, object]:
    """A file no repair makes valid: quarantined when it is this project's."""
    return staging_doc(root, candidates={"lessons": [{"summary": 5}]})


def _write_files(linked: Linked, values: list[str]) -> dict[str, bytes]:
    """One malformed staging file per value, dated in the past (settled): name -> bytes."""
    files = {}
    for i, value in enumerate(values):
        name = f"f{i}.json"
        files[name] = write(linked.staging / name, _malformed(value))
        os.utime(linked.staging / name, (OLD_MTIME, OLD_MTIME))
    return files


def _reconciler_own(node: Node, linked: Linked, values: list[str]) -> dict[str, bool]:
    """Whether the reconciler, working in the project reached through the link, takes each
    file (by name) as its own; and Node's root is the physical path."""
    answers = node.ask("own", [[str(linked.reached), v] for v in values])
    assert {root for root, _own in answers} == {str(linked.physical)}
    return {f"f{i}.json": own for i, (_root, own) in enumerate(answers)}


def _decisions(log: Path) -> dict[str, str]:
    return {
        os.path.basename(e["path"]): e["decision"]
        for e in read_events(log, strict=False)
        if e.get("event") == "decision"
    }


def test_once_and_check_call_foreign_exactly_what_the_reconciler_calls_another_projects(
    node: Node, linked: Linked, tmp_path: Path
) -> None:
    """Issue 29 item 15: through a linked project path, memstaged compared ``project_root``
    lexically with the linked root: ``../alias`` and the link path were its own, and
    quarantined (moved) though the reconciler takes them for another project's; the physical
    path, which the reconciler writes, was foreign and stayed stuck. Now ``check`` and
    ``--once`` (configured through the link) say ``foreign`` for exactly the files Node does not
    take as its own, and leave them byte for byte; the others are quarantined."""
    values = _values(linked)
    files = _write_files(linked, values)
    own = _reconciler_own(node, linked, values)
    assert any(own.values()) and not all(own.values())
    env = memstaged_env(tmp_path)
    checked = subprocess.run(
        memstaged_cmd("check", "--json", *(str(linked.memory_dir / "staging" / n) for n in files)),
        env=env,
        capture_output=True,
        text=True,
        timeout=GUARD,
        check=False,
    )
    by_check = {
        os.path.basename(line["path"]): line["decision"]
        for line in map(json.loads, checked.stdout.splitlines())
    }
    done = run_once(linked.memory_dir, env, timeout=GUARD)
    assert done.returncode == 0, done.stderr
    decided = _decisions(tmp_path / "decisions.jsonl")
    expected = {name: "quarantined" if own[name] else "foreign" for name in files}
    shown = {name: (values[int(name[1:-5])], d) for name, d in decided.items()}
    assert decided == expected, shown
    assert by_check == expected, checked.stdout
    for name, data in files.items():
        path = linked.staging / name
        assert (path.read_bytes() == data) if not own[name] else not path.exists(), name


def test_the_physical_root_is_said_once_at_start(linked: Linked, tmp_path: Path) -> None:
    """Issue 29 item 15: ``--once`` and the daemon configured through a link say once, at
    start, which physical root the memory dir's files are compared with (a
    ``project_root_physical`` event, and a line on a terminal); a memory dir whose path holds
    no link says nothing of it, and the daemon's ``memory_dir_added`` names the physical root."""
    plain = make_memory_dir(Path(os.path.realpath(tmp_path)) / "plain")
    env = memstaged_env(tmp_path)
    log = tmp_path / "decisions.jsonl"
    done = run_once(linked.memory_dir, env, "--memory-dir", str(plain), timeout=GUARD)
    assert done.returncode == 0, done.stderr
    expected = {
        "memory_dir": str(linked.memory_dir),
        "project_root": str(linked.physical),
        "named_root": str(linked.reached),
    }
    said = [e for e in read_events(log, strict=False) if e["event"] == "project_root_physical"]
    assert [{k: e[k] for k in expected} for e in said] == [expected]
    log.unlink()
    with daemon([linked.memory_dir, plain], env, "--settle", "0"):
        assert wait_for(
            lambda: any(e["event"] == "ready" for e in read_events(log, strict=False)), GUARD
        )
    events = read_events(log, strict=False)
    said = [e for e in events if e["event"] == "project_root_physical"]
    assert [{k: e[k] for k in expected} for e in said] == [expected]
    added = {e["memory_dir"]: e["project_root"] for e in events if e["event"] == "memory_dir_added"}
    assert added == {
        str(linked.memory_dir): str(linked.physical),
        str(plain): str(plain.parents[2]),
    }
    term_env = {**env, "TERM": "xterm", "PATH": os.environ["PATH"]}
    with terminal(["sh"], term_env, str(tmp_path)) as term:
        command = " ".join(
            [PYTHON, "-m", "memstaged", "--once", "--memory-dir", str(linked.memory_dir)]
        )
        screen = term.run(f"{command}; echo done-$?", r"^done-0")
    assert "project_root_physical" in screen and str(linked.physical) in screen, screen
