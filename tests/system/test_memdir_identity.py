"""Issue 19 item 7: one memory dir reached by two paths is decided once, through the first path.

A bind mount of the projects, or a symbolic link as the configured literal prefix, gives one
memory dir two paths, and a project root derived from each. The first path, in the order of
configuration (then sorted glob matches), is worked on and gives the project root; every other
path to the same directory is said in one line (one ``memory_dir_skipped`` event, and one
stderr line outside the daemon). Real bind mounts (as root: skipped where mounting is not
permitted), real links, real processes, real inotify.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support.commands import json_lines, mixed_doc, record_files, run
from support.decision_log import read_events
from support.documents import staging_doc, write
from support.helpers import make_memory_dir, memstaged_env, mounted, reap, run_once
from support.waiting import wait_until

from memstaged.cli.commands import _common
from memstaged.cli.main import main

#: Upper bound of every wait, as a failure guard only: each wait ends on the event it needs.
GUARD = 60.0
#: A lesson whose ``summary`` is a number: quarantined when the file is this project's.
BROKEN_LESSON = {"summary": 5}


@dataclass(frozen=True)
class TwoPaths:
    """``src`` holds the projects; ``other`` is the same directory by another path."""

    src: Path
    other: Path

    def real(self, project: str) -> Path:
        return self.src / project / ".pi" / "memory" / "project"

    def alias(self, project: str) -> Path:
        return self.other / project / ".pi" / "memory" / "project"

    def root(self, project: str) -> Path:
        """The project root through ``other``: its physical path (SPEC 2.4), ``src/p`` when
        ``other`` is a link, ``other/p`` through a bind mount (a mount is not a link)."""
        return Path(os.path.realpath(self.other / project))

    def elsewhere(self, project: str) -> Path:
        """The project's other path: another project's to a memory dir reached via ``other``."""
        return (
            self.src / project if self.root(project) != self.src / project else self.other / project
        )


@pytest.fixture(params=["bind mount", "linked prefix"])
def two_paths(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TwoPaths]:
    """Project ``p`` under ``src``, reached through ``other`` too: a bind mount of ``src``
    (unmounted at the end), or a symbolic link to it (the literal prefix: followed, SPEC 6)."""
    src = tmp_path / "src"
    make_memory_dir(src, "p")
    other = tmp_path / "other"
    if request.param == "bind mount":
        with mounted(other, "--bind", str(src)):
            yield TwoPaths(src, other)
    else:
        other.symlink_to(src, target_is_directory=True)
        yield TwoPaths(src, other)


def _foreign_by_the_first_path(paths: TwoPaths) -> bytes:
    """A file naming the project by its path that is not its root through ``other/p`` (the
    first path), with a lesson that cannot be made valid: through a bind mount it names
    ``src/p``, foreign through ``other/p`` and quarantined through ``src/p``; through a link
    it names ``other/p``, the link path, foreign through both (SPEC 2.4 since version 2.2: the
    root is the physical ``src/p`` either way)."""
    doc = staging_doc(paths.elsewhere("p"), "f", candidates={"lessons": [BROKEN_LESSON]})
    data = write(paths.real("p") / "staging" / "f.json", doc)
    os.utime(paths.real("p") / "staging" / "f.json", (1_700_000_000, 1_700_000_000))
    return data


def _events(tmp_path: Path, kind: str) -> list[dict[str, Any]]:
    return [
        e for e in read_events(tmp_path / "decisions.jsonl", strict=False) if e.get("event") == kind
    ]


@pytest.mark.parametrize("given", ["literal paths", "globs"])
def test_once_never_moves_a_file_foreign_through_the_first_path(
    two_paths: TwoPaths, tmp_path: Path, given: str
) -> None:
    """issue 19 item 7: ``--once`` given the same memory dir through ``other`` then ``src``
    decides each file once, with ``other``'s project root: a file foreign that way stays in
    ``staging/`` byte for byte (it used to be quarantined through ``src`` and moved, which SPEC
    2.4 forbids); ``src`` is said in one stderr line and one ``memory_dir_skipped`` event, the
    summary has one line, and the exit code is 0."""
    data = _foreign_by_the_first_path(two_paths)
    mine = staging_doc(two_paths.root("p"), "mine")
    write(two_paths.real("p") / "staging" / "mine.json", mine)
    if given == "literal paths":
        first, second = str(two_paths.alias("p")), str(two_paths.real("p"))
    else:
        first = str(two_paths.other / "*" / ".pi" / "memory" / "project")
        second = str(two_paths.src / "*" / ".pi" / "memory" / "project")
    done = run_once(first, memstaged_env(tmp_path), "--settle", "0", "--memory-dir", second)
    assert done.returncode == 0, done.stderr
    assert (two_paths.real("p") / "staging" / "f.json").read_bytes() == data
    assert not (two_paths.real("p") / "deadletter").exists()
    decided = {
        os.path.basename(e["path"]): (e["decision"], os.path.dirname(os.path.dirname(e["path"])))
        for e in _events(tmp_path, "decision")
    }
    alias = str(two_paths.alias("p"))
    assert decided == {"f.json": ("foreign", alias), "mine.json": ("valid", alias)}
    assert len(_events(tmp_path, "decision")) == 2
    assert done.stdout.decode().splitlines()[0].startswith(f"{alias}: valid=1 ")
    assert len(done.stdout.decode().splitlines()) == 1
    assert done.stderr.decode().splitlines() == [
        f"memstaged: memory dir {two_paths.real('p')} skipped: same directory as {alias}"
    ]
    [skipped] = _events(tmp_path, "memory_dir_skipped")
    assert skipped["memory_dir"] == str(two_paths.real("p"))
    assert skipped["same_as"] == alias
    assert skipped["reason"] == f"same directory as {alias}"


def test_the_daemon_holds_each_memory_dir_once_whatever_the_number_of_globs(
    two_paths: TwoPaths, tmp_path: Path
) -> None:
    """issue 19 item 7, the daemon: two globs reach every project twice (``other/*`` first).
    Each memory dir is added once, through ``other``, and its ``src`` path gets one
    ``memory_dir_skipped`` event (not one per rescan, and not a ``memory_dir_busy`` against the
    daemon's own lock); a project created later under both globs is added once too; a file
    foreign through the first path stays in ``staging/`` byte for byte; a new file is decided
    once; SIGTERM stops with 0 and nothing on stderr."""
    data = _foreign_by_the_first_path(two_paths)
    conf = tmp_path / "config.toml"
    patterns = [
        str(two_paths.other / "*" / ".pi" / "memory" / "project"),
        str(two_paths.src / "*" / ".pi" / "memory" / "project"),
    ]
    conf.write_text(f"memory_dirs = {json.dumps(patterns)}\nrescan_interval = 1\nsettle = 0.1\n")
    err = tmp_path / "daemon.err"
    with err.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "memstaged", "--config", str(conf)],
            env=memstaged_env(tmp_path),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
        )
    try:
        wait_until(lambda: _events(tmp_path, "ready"), "ready", timeout=GUARD, alive=proc, said=err)
        make_memory_dir(two_paths.src, "q")  # a new project, under both globs at once
        wait_until(
            lambda: [e for e in _events(tmp_path, "memory_dir_added") if "/q/" in e["memory_dir"]],
            "q added",
            timeout=GUARD,
            alive=proc,
            said=err,
        )
        write(two_paths.real("q") / "staging" / "new.json", staging_doc(two_paths.root("q")))
        wait_until(
            lambda: _events(tmp_path, "decision"),
            "new.json decided",
            timeout=GUARD,
            alive=proc,
            said=err,
        )
        rescans = len(_events(tmp_path, "rescan"))
        wait_until(
            lambda: len(_events(tmp_path, "rescan")) >= rescans + 2,
            "two rescans",
            timeout=GUARD,
            alive=proc,
            said=err,
        )
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=GUARD) == 0
    finally:
        reap(proc)
    added = [(e["memory_dir"], e["project_root"]) for e in _events(tmp_path, "memory_dir_added")]
    assert added == [
        (str(two_paths.alias("p")), str(two_paths.root("p"))),
        (str(two_paths.alias("q")), str(two_paths.root("q"))),
    ]
    assert _events(tmp_path, "memory_dir_busy") == []  # it was, against the daemon's own lock
    skipped = [(e["memory_dir"], e["same_as"]) for e in _events(tmp_path, "memory_dir_skipped")]
    assert skipped == [
        (str(two_paths.real("p")), str(two_paths.alias("p"))),
        (str(two_paths.real("q")), str(two_paths.alias("q"))),
    ]
    decided = [(e["path"], e["decision"]) for e in _events(tmp_path, "decision")]
    assert decided == [
        (str(two_paths.alias("p") / "staging" / "f.json"), "foreign"),
        (str(two_paths.alias("q") / "staging" / "new.json"), "valid"),
    ]
    assert (two_paths.real("p") / "staging" / "f.json").read_bytes() == data
    assert not (two_paths.real("p") / "deadletter").exists()
    assert err.read_text() == ""


@pytest.mark.usefixtures("plain_output")
def test_recover_and_purge_work_once_on_a_memory_dir_given_twice(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    two_paths: TwoPaths,
    tmp_path: Path,
) -> None:
    """issue 19 item 7, ``deadletter recover`` and ``purge`` given ``src/p`` then ``other/p``:
    each record is recovered (or listed, or deleted) once, through ``src/p`` and its project
    root, never a second time as ``gone`` or ``left`` through the other path; ``other/p`` is
    said in one stderr line and, when the command logs, one ``memory_dir_skipped`` event."""
    log_file = tmp_path / "decisions.jsonl"
    monkeypatch.setenv("MEMSTAGED_LOG_FILE", str(log_file))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg-config"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg-state"))
    real, alias = two_paths.real("p"), two_paths.alias("p")
    write(real / "staging" / "mixed.json", mixed_doc(two_paths.src / "p"))
    assert main(["--once", "--memory-dir", str(real), "--settle", "0"]) == 0
    records = record_files(real)
    assert len(records) == 4  # one per candidate: three recoverable, one lesson that is not
    both = ["--memory-dir", str(real), "--memory-dir", str(alias)]
    said = f"memstaged: memory dir {alias} skipped: same directory as {real}"

    code, out, err = run(capsys, "deadletter", "recover", "--all", "--json", *both)
    outcomes = json_lines(out)
    assert sorted(o["id"] for o in outcomes) == sorted(n[: -len(".json")] for n in records)
    assert sorted((o["memory_dir"], o["action"]) for o in outcomes) == [
        (str(real), "left"),
        *[(str(real), "recovered")] * 3,
    ]
    assert code == 1, (out, err)  # the bad lesson stays
    assert err.splitlines() == [said]
    [record] = record_files(real)
    assert [p.name for p in (real / "staging").iterdir()] == ["mixed.recovered-1.json"]

    later = _common.now() + 2 * 86_400
    monkeypatch.setattr(_common, "now", lambda: later)
    code, out, err = run(capsys, "deadletter", "purge", "--older-than", "1d", "--json", *both)
    assert [(r["memory_dir"], r["name"]) for r in json_lines(out) if r["kind"] == "record"] == [
        (str(real), record)
    ]
    assert code == 0, (out, err)
    assert err.splitlines() == [said]
    code, out, err = run(capsys, "deadletter", "purge", "--older-than", "1d", "--yes", *both)
    assert code == 0, (out, err)
    assert err.splitlines() == [said]
    assert record_files(real) == {}
    skipped = [
        e for e in read_events(log_file, strict=False) if e.get("event") == "memory_dir_skipped"
    ]
    assert [(e["memory_dir"], e["same_as"]) for e in skipped] == [(str(alias), str(real))] * 2
