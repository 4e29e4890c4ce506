"""The daemon as users run it: ``python -m memstaged --memory-dir D --settle 0.5`` in a subprocess,
real writers, a real inotify observer, and the decision log read back from ``MEMSTAGED_LOG_FILE``.

Waiting is always "until this line is in the log, at most N seconds"; a test never sleeps to let
the daemon catch up (the writers that pause do so because slow writers pause).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.daemon_process import WAIT, DaemonProcess, glob_config, many_projects
from support.decision_log import read_events
from support.documents import lesson, malformed, put, repairable, staging_doc, write
from support.helpers import (
    REPO,
    daemon,
    fd_count,
    make_memory_dir,
    memstaged_cmd,
    memstaged_env,
    project_root_of,
    special_entries,
    temps_in,
)
from support.notify_socket import NotifySocket
from support.waiting import wait_for

from memstaged.daemon.memory_dirs import FD_RESERVE
from memstaged.deadletter import acks


def _doc_bytes(project: Path, session: str = "s1") -> bytes:
    return json.dumps(staging_doc(project, session), indent=2).encode()


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _no_temp_files(memory_dir: Path) -> bool:
    return not list(memory_dir.rglob(".memstaged~*"))


# -- writers ----------------------------------------------------------------------------------


def test_file_written_in_pieces_is_never_quarantined(
    project: Path, memory_dir: Path, spawn: Callable[..., DaemonProcess]
) -> None:
    """A slow writer appends a file in 8 pieces, closing it after each: every close makes the
    daemon look, it defers the unparseable prefixes, and the finished file is valid, untouched
    and never quarantined."""
    daemon = spawn("--memory-dir", str(memory_dir), "--settle", "0.5")
    data = _doc_bytes(project)
    path = memory_dir / "staging" / "slow.json"
    step = len(data) // 8 + 1
    for i in range(0, len(data), step):
        with path.open("ab") as fh:
            fh.write(data[i : i + step])
        time.sleep(0.1)  # a writer that pauses (less than --settle) between pieces
    final = daemon.wait_decided("slow.json")["slow.json"]
    assert final["decision"] == "valid"
    assert final["sha256"] == _sha(data)
    assert "deferred" in daemon.decisions("slow.json")
    assert "quarantined" not in daemon.decisions("slow.json")
    assert path.read_bytes() == data
    assert not (memory_dir / "deadletter").exists()


def test_renamed_in_files_are_decided_without_waiting_for_settle(
    tmp_path: Path, project: Path, memory_dir: Path, spawn: Callable[..., DaemonProcess]
) -> None:
    """With --settle 3600, files renamed in (from a temp name in staging/, or from another
    directory) are decided at once, never deferred: a rename is a complete write. (Not timed:
    with an hour to settle, a wait for it would outlast the guard; issue 19 item 8.)"""
    daemon = spawn("--memory-dir", str(memory_dir), "--settle", "3600")
    tmp_inside = memory_dir / "staging" / ".in.json.tmp"
    tmp_inside.write_bytes(_doc_bytes(project, "inside"))
    os.rename(tmp_inside, memory_dir / "staging" / "inside.json")
    outside = tmp_path / "outside.tmp"
    outside.write_bytes(b'["not", "a", "staging", "file"]')
    os.rename(outside, memory_dir / "staging" / "outside.json")
    final = daemon.wait_decided("inside.json", "outside.json")
    assert "deferred" not in daemon.decisions("inside.json") + daemon.decisions("outside.json")
    assert final["inside.json"]["decision"] == "valid"
    assert final["outside.json"]["decision"] == "quarantined"
    assert not (memory_dir / "staging" / "outside.json").exists()
    assert daemon.decisions(".in.json.tmp") == []


def _burst(
    project: Path, memory_dir: Path, count: int, garbage_every: int = 10
) -> dict[str, bytes]:
    """Write ``count`` files as fast as possible (some of them garbage), by rename."""
    files: dict[str, bytes] = {}
    doc = staging_doc(project, "burst")
    valid = json.dumps(doc).encode()
    staging = memory_dir / "staging"
    for i in range(count):
        name = f"b{i:05}.json"
        data = b"garbage %d" % i if i % garbage_every == 0 else valid
        tmp = staging / f".{name}.tmp"
        tmp.write_bytes(data)
        os.rename(tmp, staging / name)
        files[name] = data
    return files


def _check_burst(memory_dir: Path, daemon: DaemonProcess, files: dict[str, bytes]) -> None:
    final = daemon.wait_decided(*files, timeout=120)
    originals = {p.read_bytes() for p in (memory_dir / "deadletter" / "originals").iterdir()}
    for name, data in files.items():
        if data.startswith(b"garbage"):
            assert final[name]["decision"] == "quarantined", name
            assert data in originals
            assert not (memory_dir / "staging" / name).exists()
        else:
            assert final[name]["decision"] == "valid", name
            assert (memory_dir / "staging" / name).read_bytes() == data
    assert _no_temp_files(memory_dir)


def test_burst_of_3000_files_every_file_decided(
    project: Path, memory_dir: Path, spawn: Callable[..., DaemonProcess]
) -> None:
    """3,000 files at once: every one gets its final decision; valid ones are untouched, the
    garbage ones are in deadletter/ with their bytes."""
    daemon = spawn("--memory-dir", str(memory_dir), "--settle", "0.5")
    _check_burst(memory_dir, daemon, _burst(project, memory_dir, 3000, garbage_every=50))


@pytest.mark.slow
def test_burst_of_20000_files_every_file_decided(
    project: Path, memory_dir: Path, spawn: Callable[..., DaemonProcess]
) -> None:
    """20,000 files at once overflow inotify's queue (16,384 events): the overflow is noticed,
    the staging dir rescanned, and every file still gets its final decision."""
    daemon = spawn("--memory-dir", str(memory_dir), "--settle", "0.5")
    _check_burst(memory_dir, daemon, _burst(project, memory_dir, 20000))


def test_editor_style_saves_are_decided_on_the_new_content(
    project: Path, memory_dir: Path, spawn: Callable[..., DaemonProcess]
) -> None:
    """An editor that saves by renaming the old file to a backup and writing a new one, and one
    that truncates and rewrites in place: each save ends with the new content decided valid,
    nothing quarantined, and the backup name never touched."""
    daemon = spawn("--memory-dir", str(memory_dir), "--settle", "0.5")
    staging = memory_dir / "staging"
    path = staging / "edit.json"
    first = _doc_bytes(project, "v1")
    path.write_bytes(first)
    assert daemon.wait_decided("edit.json")["edit.json"]["sha256"] == _sha(first)

    second = _doc_bytes(project, "v2")
    os.rename(path, staging / "edit.json~")  # vim's backup
    (staging / ".edit.json.swp").write_bytes(b"swap")
    path.write_bytes(second)
    (staging / "edit.json~").unlink()
    daemon.wait_for(
        lambda ev: any(e.get("sha256") == _sha(second) for e in ev), "the second version"
    )

    third = _doc_bytes(project, "v3")
    with path.open("r+b") as fh:  # in place: truncate, write in two parts, close
        fh.truncate(0)
        fh.write(third[:50])
        fh.flush()
        fh.write(third[50:])
    daemon.wait_for(
        lambda ev: any(e.get("sha256") == _sha(third) and e["decision"] == "valid" for e in ev),
        "the third version",
    )
    assert path.read_bytes() == third
    assert "quarantined" not in daemon.decisions("edit.json")
    assert daemon.decisions("edit.json~") == daemon.decisions(".edit.json.swp") == []
    assert not (memory_dir / "deadletter").exists()


# -- signals ----------------------------------------------------------------------------------


def test_sigterm_mid_burst_exits_0_quickly_and_leaves_nothing_half_done(
    project: Path, memory_dir: Path, spawn: Callable[..., DaemonProcess]
) -> None:
    """SIGTERM while 2,000 files are being decided: exit code 0, a `stop` event, no temp file
    left, and every file either still in staging/ or in deadletter/ with its bytes. The time
    to exit is printed, not asserted: a busy machine stretches it (issue 19 item 8); SPEC 6's
    second is measured by `make bench` (measure 14)."""
    daemon = spawn("--memory-dir", str(memory_dir), "--settle", "0.5")
    files = _burst(project, memory_dir, 2000)
    started = time.monotonic()
    assert daemon.stop(signal.SIGTERM) == 0
    print(f"SIGTERM mid-burst: exited {time.monotonic() - started:.3f} s later")
    assert daemon.events()[-1]["event"] == "stop"
    assert _no_temp_files(memory_dir)
    originals_dir = memory_dir / "deadletter" / "originals"
    originals = (
        {p.read_bytes() for p in originals_dir.iterdir()} if originals_dir.exists() else set()
    )
    for name, data in files.items():
        path = memory_dir / "staging" / name
        assert (path.exists() and path.read_bytes() == data) or data in originals, name


def _holds_open(pid: int, path: Path) -> bool:
    """Whether process ``pid`` has ``path`` open (the pipeline keeps the file it decides open)."""
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") == str(path):
                return True
        except OSError:
            continue
    return False


@pytest.mark.timeout(600)  # 30-90 s on a busy 2-core machine
def test_sigterm_is_acted_on_within_a_second_whatever_file_is_in_hand(
    tmp_path: Path, project: Path, memory_dir: Path, spawn: Callable[..., DaemonProcess]
) -> None:
    """SPEC 6 (issue 10 item 9: a large file made the daemon ignore SIGTERM for minutes): a
    SIGTERM that arrives while the daemon is deciding a 30 MB file of 120,000 lessons to repair
    (seconds of work) stops it at once: exit 0, a `stop` naming the abandoned file, the file
    untouched in staging/, and the next start repairs it and leaves no temp file (a temp the
    stop left is recovery's, as after a kill). The time from SIGTERM to exit is printed."""
    conf = tmp_path / "config.toml"
    conf.write_text(
        f"memory_dirs = [{json.dumps(str(memory_dir))}]\nmax_file_size = {64 * 1024 * 1024}\n"
    )
    daemon = spawn("--config", str(conf))
    doc = staging_doc(project, "huge")
    doc["candidates"]["lessons"] = [dict(doc["candidates"]["lessons"][0], triggers=[])] * 120_000
    data = json.dumps(doc).encode()
    path = memory_dir / "staging" / "huge.json"
    tmp = memory_dir / "staging" / ".huge.json.tmp"
    tmp.write_bytes(data)
    os.rename(tmp, path)
    deadline = time.monotonic() + 30
    while not _holds_open(daemon.proc.pid, path):
        assert time.monotonic() < deadline, "the daemon never opened the file"
        time.sleep(0.005)
    started = time.monotonic()
    assert daemon.stop(signal.SIGTERM, timeout=20) == 0
    print(f"SIGTERM with a 30 MB file in hand: exited {time.monotonic() - started:.3f} s later")
    stop = daemon.events()[-1]
    assert stop["event"] == "stop"
    assert stop["abandoned"] == str(path)
    assert daemon.decisions("huge.json") == []
    assert path.read_bytes() == data
    again = spawn("--config", str(conf), name="again", ready_timeout=120)
    assert again.wait_decided_version("huge.json", data, timeout=240)["decision"] == "repaired"
    assert _no_temp_files(memory_dir)


def test_watchdog_pings_keep_coming_while_a_hostile_file_is_decided(
    tmp_path: Path, project: Path, memory_dir: Path, spawn: Callable[..., DaemonProcess]
) -> None:
    """Issue 19 item 5: while the daemon decided one hostile file (24 s for an 8 MiB
    ``produced_at``), no ``WATCHDOG=1`` was sent, and systemd killed it. A real daemon under a
    ``NOTIFY_SOCKET`` with ``WATCHDOG_USEC`` of 0.3 s is handed the slowest file for its size
    now that the date parser reads long texts in bulk (issue 19 item 5, second part): 20,000
    empty lessons, each explained by the schema and quarantined as a record of its own. Pings
    keep coming from inside that decision (schema validation and the records loop tick), at
    least three between the moment the daemon holds the file open and the decision in the log
    (they came only from the date parser and the keyword topic: none here). The file is
    quarantined."""
    notify = NotifySocket()
    try:
        daemon = spawn(
            "--memory-dir",
            str(memory_dir),
            "--settle",
            "0.1",
            env={"NOTIFY_SOCKET": notify.path, "WATCHDOG_USEC": "300000"},
        )
        doc = staging_doc(project, "slow")
        doc["candidates"]["lessons"] = [{}] * 20_000
        path = memory_dir / "staging" / "slow.json"
        tmp = memory_dir / "staging" / ".slow.json.tmp"
        tmp.write_bytes(json.dumps(doc).encode())
        os.rename(tmp, path)
        deadline = time.monotonic() + 30
        while not _holds_open(daemon.proc.pid, path):
            assert time.monotonic() < deadline, "the daemon never opened the file"
            time.sleep(0.001)
        before = len(notify.messages)
        assert daemon.decisions("slow.json") == []  # still deciding it
        daemon.wait_for(lambda ev: bool(daemon.decisions("slow.json")), "its decision", 120)
        during = notify.messages[before:]
        decided = daemon.decisions("slow.json")
        assert decided == ["quarantined"]
        pings = sum("WATCHDOG=1" in m.split("\n") for m in during)
        print(f"{pings} pings while the file was decided")
        assert pings >= 3
        assert daemon.stop(signal.SIGTERM, timeout=20) == 0
    finally:
        notify.close()


@pytest.mark.timeout(600)  # 30-90 s on a busy 2-core machine
def test_sigterm_while_a_quarantine_writes_its_records_leaves_them_to_recovery(
    tmp_path: Path, project: Path, memory_dir: Path, spawn: Callable[..., DaemonProcess]
) -> None:
    """SPEC 6 (issue 10 item 9): a SIGTERM while the daemon writes the 40,000 record temps of
    a quarantine stops it without unlinking them first (that took 3.4 s for 100,000 records,
    against SPEC 6's second): exit 0, `stop` names the abandoned file, the file is untouched in
    staging/, the temps are left exactly as a SIGKILL would leave them, and nothing with a final
    name is in deadletter/. The next start deletes the temps in one logged event and carries
    the quarantine out: every record, the original, no temp. The time to exit is printed; it
    is measured by the benchmark (measure 14)."""
    conf = tmp_path / "config.toml"
    conf.write_text(f"memory_dirs = [{json.dumps(str(memory_dir))}]\n")
    daemon = spawn("--config", str(conf))
    doc = staging_doc(project, "many")
    doc["candidates"]["lessons"] = [{}] * 40_000
    data = json.dumps(doc).encode()
    path = memory_dir / "staging" / "many.json"
    tmp = memory_dir / "staging" / ".many.json.tmp"
    tmp.write_bytes(data)
    os.rename(tmp, path)
    dl = memory_dir / "deadletter"
    deadline = time.monotonic() + 60
    while sum(1 for _ in dl.glob(".memstaged~*")) < 500 if dl.is_dir() else True:
        assert time.monotonic() < deadline, "the daemon never wrote the records' temps"
        time.sleep(0.002)
    started = time.monotonic()
    assert daemon.stop(signal.SIGTERM, timeout=20) == 0
    took = time.monotonic() - started
    print(f"SIGTERM with 40,000 record temps being written: exited {took:.3f} s later")
    stop = daemon.events()[-1]
    assert stop["event"] == "stop"
    assert stop["abandoned"] == str(path)
    assert path.read_bytes() == data
    left = sum(1 for _ in dl.rglob(".memstaged~*"))
    assert left >= 500, f"the stop unlinked the temps ({left} left)"
    assert not list(dl.glob("*.json")), "the stop installed records of an abandoned quarantine"

    again = spawn("--config", str(conf), name="again", ready_timeout=120)
    last = again.wait_decided("many.json", timeout=180)["many.json"]
    assert last["decision"] == "quarantined"
    recovered = [e for e in again.events() if e["event"] == "temp_recovered"]
    assert {e["path"] for e in recovered} <= {"deadletter", "deadletter/originals"}
    assert sum(e["deleted"] for e in recovered) == left
    named = {Path(d).name for d in last["deadletter"] if not d.startswith("deadletter/originals/")}
    assert len(named) >= 40_000
    assert {p.name for p in dl.glob("*.json")} == named
    assert [p.read_bytes() for p in (dl / "originals").iterdir()] == [data]
    assert not path.exists()
    assert _no_temp_files(memory_dir)


def test_sigint_exits_0(memory_dir: Path, spawn: Callable[..., DaemonProcess]) -> None:
    """Ctrl-C in a terminal stops the daemon like SIGTERM: exit code 0, no traceback."""
    daemon = spawn("--memory-dir", str(memory_dir))
    assert daemon.stop(signal.SIGINT) == 0
    assert b"Traceback" not in daemon.stderr_file.read_bytes()


def _write_config(path: Path, *memory_dirs: Path) -> None:
    dirs = ", ".join(json.dumps(str(m)) for m in memory_dirs)
    path.write_text(f"memory_dirs = [{dirs}]\nsettle = 0.5\n")


def test_sighup_reload_bad_config_keeps_running_good_config_adds_memory_dir(
    tmp_path: Path, project: Path, memory_dir: Path, spawn: Callable[..., DaemonProcess]
) -> None:
    """SIGHUP with a broken config file: the daemon logs why, keeps its configuration and goes
    on deciding files. SIGHUP with a fixed config that adds a memory dir: that dir's files are
    decided."""
    conf = tmp_path / "config.toml"
    _write_config(conf, memory_dir)
    daemon = spawn("--config", str(conf))
    conf.write_text("memory_dirs = [\n")
    daemon.proc.send_signal(signal.SIGHUP)
    failed = daemon.wait_for(lambda ev: any(e["event"] == "reload" for e in ev), "a reload")
    reload_event = next(e for e in failed if e["event"] == "reload")
    assert reload_event["ok"] is False
    assert str(conf) in reload_event["error"]
    (memory_dir / "staging" / "a.json").write_bytes(_doc_bytes(project))
    assert daemon.wait_decided("a.json")["a.json"]["decision"] == "valid"

    other_project = tmp_path / "other"
    other = other_project / ".pi" / "memory" / "project"
    (other / "staging").mkdir(parents=True)
    (other / "staging" / "b.json").write_bytes(_doc_bytes(other_project))
    _write_config(conf, memory_dir, other)
    daemon.proc.send_signal(signal.SIGHUP)
    assert daemon.wait_decided("b.json")["b.json"]["decision"] == "valid"
    assert [e["ok"] for e in daemon.events() if e["event"] == "reload"] == [False, True]
    assert daemon.proc.poll() is None
    assert daemon.stop() == 0


def test_sighup_with_a_config_nested_too_deep_keeps_the_old_settings(
    tmp_path: Path, project: Path, memory_dir: Path, spawn: Callable[..., DaemonProcess]
) -> None:
    """Issue 29 item 3: SIGHUP with a config holding a value nested 1,000 deep made the daemon
    log ``crash`` (a ``RecursionError``) and exit. The reload is refused with one line, and the
    daemon goes on deciding files with its old settings."""
    conf = tmp_path / "config.toml"
    _write_config(conf, memory_dir)
    daemon = spawn("--config", str(conf))
    conf.write_text("settle = " + "[" * 1000 + "]" * 1000 + "\n")
    daemon.proc.send_signal(signal.SIGHUP)
    events = daemon.wait_for(lambda ev: any(e["event"] == "reload" for e in ev), "a reload")
    reload_event = next(e for e in events if e["event"] == "reload")
    assert reload_event["ok"] is False
    assert reload_event["error"] == f"{conf}: not valid TOML: a value is nested too deep"
    (memory_dir / "staging" / "a.json").write_bytes(_doc_bytes(project))
    assert daemon.wait_decided("a.json")["a.json"]["decision"] == "valid"
    assert daemon.stop() == 0
    assert "Traceback" not in daemon.stderr_file.read_text()


def test_a_fifo_at_the_marks_does_not_stop_a_quarantine_holding_the_lock(
    tmp_path: Path, project: Path, memory_dir: Path, spawn: Callable[..., DaemonProcess]
) -> None:
    """Issue 29 item 4: with the metrics file on, a FIFO at the memory dir's ack marks
    (``acked/<hash>.json``) stopped the daemon in the middle of a quarantine, holding
    ``canonical-writer.lock`` for ever and deaf to SIGTERM. The marks are read through the
    file layer's safe open: the quarantine is carried out, the lock released, the metrics
    written, and SIGTERM obeyed."""
    metrics = tmp_path / "metrics" / "memstaged.prom"
    metrics.parent.mkdir()
    marks = tmp_path / "xdg-state" / "memstaged" / acks.ACKED_DIR / acks.file_name(str(memory_dir))
    marks.parent.mkdir(parents=True, mode=0o700)
    os.mkfifo(marks, 0o600)
    daemon = spawn(
        "--memory-dir", str(memory_dir), "--settle", "0.3",
        env={"MEMSTAGED_METRICS_FILE": str(metrics)},
    )  # fmt: skip
    (memory_dir / "staging" / "bad.json").write_bytes(b"not JSON")
    assert daemon.wait_decided("bad.json")["bad.json"]["decision"] == "quarantined"
    # The decision is logged before it is carried out (SPEC 5): the metrics, written once the
    # loop has the transaction's result, say when it is done and the lock is let go.
    assert daemon.wait_for(
        lambda _ev: b"memstaged_deadletter_unseen_records 1" in _read_or_empty(metrics), "metrics"
    )
    assert not (memory_dir / "canonical-writer.lock").exists()
    assert daemon.stop() == 0


def _read_or_empty(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return b""


# -- new projects under a glob -------------------------------------------------------------------


def _git(*args: str, cwd: Path) -> None:
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
        env={**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull},
    )


def test_new_projects_under_a_glob_are_seen_at_once_without_a_rescan(
    tmp_path: Path, spawn: Callable[..., DaemonProcess]
) -> None:
    """issue 12: with `src/*/.pi/memory/project` configured and rescans an hour apart, a
    project made with `mkdir -p` and one made by `git clone` (the whole tree at once) each have
    their staging file decided from the watches of the glob's parent directories alone (no
    `rescan` event ever happens); a project removed is dropped. Timings are printed."""
    src = tmp_path / "src"
    src.mkdir()
    conf = tmp_path / "config.toml"
    pattern = str(src / "*" / ".pi" / "memory" / "project")
    conf.write_text(
        f"memory_dirs = [{json.dumps(pattern)}]\nsettle = 0.5\nrescan_interval = 3600\n"
    )
    daemon = spawn("--config", str(conf))

    made = src / "made" / ".pi" / "memory" / "project"
    started = time.monotonic()
    (made / "staging").mkdir(parents=True)
    (made / "staging" / "m.json").write_bytes(_doc_bytes(src / "made"))
    assert daemon.wait_decided("m.json")["m.json"]["decision"] == "valid"
    print(f"mkdir -p: first file decided {time.monotonic() - started:.3f} s after the mkdir")

    origin = tmp_path / "origin"
    (origin / ".pi" / "memory" / "project" / "staging").mkdir(parents=True)
    clone_doc = json.dumps(staging_doc(src / "cloned", "c"), indent=2).encode()
    (origin / ".pi" / "memory" / "project" / "staging" / "c.json").write_bytes(clone_doc)
    _git("init", "-q", cwd=origin)
    _git("add", ".", cwd=origin)
    _git("commit", "-qm", "memory", cwd=origin)
    started = time.monotonic()
    _git("clone", "-q", str(origin), str(src / "cloned"), cwd=tmp_path)
    final = daemon.wait_decided("c.json")["c.json"]
    print(f"git clone: first file decided {time.monotonic() - started:.3f} s after the clone began")
    assert final["decision"] == "valid"
    assert final["sha256"] == _sha(clone_doc)

    shutil.rmtree(src / "made")
    removed = daemon.wait_for(
        lambda ev: any(e["event"] == "memory_dir_removed" for e in ev), "the project to be dropped"
    )
    assert [e["memory_dir"] for e in removed if e["event"] == "memory_dir_removed"] == [str(made)]
    assert [e for e in daemon.events() if e["event"] == "rescan"] == []
    assert daemon.stop() == 0


# -- bounded resources: 1,100 memory dirs under a service manager's limits ----------------------


def _process_figures(pid: int) -> dict[str, int]:
    """Descriptors, inotify instances and watches, threads and RSS (KiB) of a process."""
    fds = os.listdir(f"/proc/{pid}/fd")
    inotify = watches = 0
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") == "anon_inode:inotify":
                inotify += 1
                info = Path(f"/proc/{pid}/fdinfo/{fd}").read_text()
                watches += info.count("inotify wd:")
        except OSError:
            continue
    status = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    return {
        "fds": len(fds),
        "inotify_instances": inotify,
        "inotify_watches": watches,
        "threads": int(status["Threads"]),
        "rss_kib": int(status["VmRSS"].split()[0]),
    }


def _mapped_files(pid: int) -> set[str]:
    """The names of the files a process has mapped (its shared objects among them)."""
    names = set()
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5].startswith("/"):
            names.add(Path(fields[5]).name)
    return names


def test_the_daemon_maps_no_openssl_after_deciding_every_kind_of_file(
    tmp_path: Path, spawn: Callable[..., DaemonProcess]
) -> None:
    """Issue 23, the idle daemon's memory (< 25 MB on 50 memory dirs, measure 6): a daemon with
    its metrics file and control socket on, which decided a valid, a repaired and a quarantined
    file (the digests in their events, the rewrite's, the original's name), has not mapped
    OpenSSL's libcrypto or libssl (3.4 MB of its resident memory). Its digests are SHA-256's,
    as ``hashlib`` computes them."""
    mdirs = many_projects(tmp_path / "src", 3)
    metrics = tmp_path / "metrics" / "memstaged.prom"
    metrics.parent.mkdir()
    args = [a for m in mdirs for a in ("--memory-dir", str(m))]
    daemon = spawn(*args, "--settle", "0.5", env={"MEMSTAGED_METRICS_FILE": str(metrics)})
    project = mdirs[0].parents[2]
    staging = mdirs[0] / "staging"
    valid = write(staging / "valid.json", staging_doc(project, "v"))
    no_triggers = staging_doc(project, "nt", candidates={"lessons": [lesson(triggers=[])]})
    write(staging / "repair.json", no_triggers)
    bad = write(staging / "bad.json", staging_doc(project, "bad", schemaVersion="1"))
    final = daemon.wait_decided("valid.json", "repair.json", "bad.json")
    rewrite = next(
        e for e in daemon.events() if e["event"] == "decision" and e["decision"] == "repaired"
    )
    assert final["valid.json"]["decision"] == "valid"
    assert final["valid.json"]["sha256"] == _sha(valid)
    assert rewrite["rewrite_sha256"] == _sha((staging / "repair.json").read_bytes())
    assert final["bad.json"]["sha256"] == _sha(bad)
    [original] = (mdirs[0] / "deadletter" / "originals").iterdir()
    assert original.name.endswith(f".{_sha(bad)[:16]}.orig")
    assert original.read_bytes() == bad
    socket_file = Path(os.environ["XDG_RUNTIME_DIR"], "memstaged", f"daemon-{daemon.proc.pid}.sock")
    assert socket_file.exists()
    deadline = time.monotonic() + WAIT
    while not metrics.exists():  # written after the first event, from the work loop
        assert time.monotonic() < deadline, "no metrics file"
        time.sleep(0.02)
    figures = _process_figures(daemon.proc.pid)
    openssl = sorted(
        n for n in _mapped_files(daemon.proc.pid) if n.startswith(("libcrypto", "libssl"))
    )
    assert openssl == [], f"RSS {figures['rss_kib'] / 1024:.1f} MiB"
    print(f"3 memory dirs, after 3 decisions: RSS {figures['rss_kib'] / 1024:.1f} MiB")
    assert daemon.stop() == 0


def test_1100_memory_dirs_under_a_soft_limit_of_1024_descriptors(
    tmp_path: Path, spawn: Callable[..., DaemonProcess]
) -> None:
    """issue 10 item 11, SPEC 6: with systemd's default soft limit of 1,024 descriptors (the
    hard limit above it) and 1,100 projects under a glob, the daemon raises its soft limit to
    the hard one and says so in `start`, holds every memory dir, and a file dropped in the last
    one is decided. It holds one descriptor per memory dir plus a constant, one inotify
    instance, and a constant number of threads (figures printed)."""
    src = tmp_path / "src"
    mdirs = many_projects(src, 1100)
    daemon = spawn(
        "--config", str(glob_config(tmp_path, src)), nofile=(1024, 4096), ready_timeout=120
    )
    start = _event(daemon, "start")
    assert (start["nofile"], start["nofile_raised_from"], start["nofile_hard"]) == (
        4096,
        1024,
        4096,
    )
    assert _event(daemon, "ready")["memory_dirs"] == 1100
    data = _doc_bytes(mdirs[-1].parents[2], "last")
    (mdirs[-1] / "staging" / "last.json").write_bytes(data)
    final = daemon.wait_decided("last.json", timeout=30)["last.json"]
    assert final["decision"] == "valid"
    assert final["sha256"] == _sha(data)
    figures = _process_figures(daemon.proc.pid)
    print(f"1,100 memory dirs: {figures}")
    assert figures["fds"] <= 1100 + 32
    assert figures["inotify_instances"] == 1
    assert figures["threads"] <= 4
    assert [e for e in daemon.events() if e.get("level") == "error"] == []
    started = time.monotonic()
    assert daemon.stop() == 0
    print(f"1,100 memory dirs: SIGTERM to exit {time.monotonic() - started:.3f} s")


def test_1000_memory_dirs_fit_under_a_hard_limit_of_1024_descriptors(
    tmp_path: Path, spawn: Callable[..., DaemonProcess]
) -> None:
    """issue 10 item 11, SPEC 6: "1,000 memory dirs under a soft limit of 1,024" holds even
    when the hard limit is 1,024 too (nothing to raise): the descriptor reserve is small enough
    (docs/daemon.md counts it) that all 1,000 are held, none is refused, and a malformed file
    in the last one is quarantined (records and original written: the heaviest decision)."""
    src = tmp_path / "src"
    mdirs = many_projects(src, 1000)
    daemon = spawn(
        "--config", str(glob_config(tmp_path, src)), nofile=(1024, 1024), ready_timeout=120
    )
    assert _event(daemon, "ready")["memory_dirs"] == 1000
    (mdirs[-1] / "staging" / "last.json").write_bytes(b"{not json")
    final = daemon.wait_decided("last.json", timeout=30)["last.json"]
    assert final["decision"] == "quarantined"
    assert not (mdirs[-1] / "staging" / "last.json").exists()
    assert list((mdirs[-1] / "deadletter" / "originals").iterdir())
    assert [e for e in daemon.events() if e.get("level") == "error"] == []
    assert daemon.stop() == 0


def test_memory_dirs_beyond_a_hard_descriptor_limit_leave_the_others_working(
    tmp_path: Path, spawn: Callable[..., DaemonProcess]
) -> None:
    """issue 10 item 11: when even the hard limit is too low for every memory dir (here 256
    descriptors for 300 projects), the daemon is not wedged by EMFILE: it holds as many as
    leave a reserve of descriptors for the work, says once for each of the others why it is
    not watched, and still decides files in the dirs it holds."""
    src = tmp_path / "src"
    mdirs = many_projects(src, 300)
    daemon = spawn("--config", str(glob_config(tmp_path, src)), nofile=(256, 256))
    held = _event(daemon, "ready")["memory_dirs"]
    refused = [e for e in daemon.events() if e["event"] == "memory_dir_error"]
    assert held == 256 - FD_RESERVE
    assert len(refused) == 300 - held
    assert all("descriptor limit 256" in e["error"] for e in refused)
    data = _doc_bytes(mdirs[0].parents[2], "first")
    (mdirs[0] / "staging" / "first.json").write_bytes(data)
    assert daemon.wait_decided("first.json")["first.json"]["decision"] == "valid"
    assert daemon.stop() == 0


# -- one memstaged per memory dir ---------------------------------------------------------------


def test_second_instance_exits_1_and_a_killed_one_blocks_nobody(
    memory_dir: Path, spawn: Callable[..., DaemonProcess]
) -> None:
    """A second daemon or --once on a busy memory dir says so and exits 1 (the daemon, whose
    every memory dir the first one holds: that memstaged is already running, issue 31 item 6);
    after the first is killed with SIGKILL, a new daemon starts at once (the lock died with
    the process). (The --once shares the daemons' state dir, where the instance locks are.)"""
    first = spawn("--memory-dir", str(memory_dir), name="first")
    second = spawn("--memory-dir", str(memory_dir), name="second", ready=False)
    assert second.proc.wait(timeout=10) == 1
    message = second.stderr_file.read_text()
    assert message.startswith(f"memstaged is already running (pid {first.proc.pid}")
    once = subprocess.run(
        [sys.executable, "-m", "memstaged", "--once", "--memory-dir", str(memory_dir)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        env={
            **os.environ,
            "MEMSTAGED_LOG_FILE": str(memory_dir.parent / "once.jsonl"),
            "XDG_STATE_HOME": str(first.state_home),
        },
    )
    assert once.returncode == 1
    assert f"the memstaged daemon (pid {first.proc.pid}" in once.stdout + once.stderr
    first.kill()
    third = spawn("--memory-dir", str(memory_dir), name="third")
    assert third.stop() == 0


# -- restarts: the seen cache ------------------------------------------------------------------


def _seen_files(tmp_path: Path) -> list[Path]:
    """The seen cache files the daemons of this test wrote (``XDG_STATE_HOME`` is per test)."""
    return sorted((tmp_path / "xdg-state" / "memstaged" / "seen").glob("*.msgpack"))


def _event(daemon: DaemonProcess, name: str) -> dict[str, Any]:
    return next(e for e in daemon.events() if e["event"] == name)


def _decided_names(daemon: DaemonProcess) -> set[str]:
    return {Path(e["path"]).name for e in daemon.events() if e["event"] == "decision"}


def _three_files(project: Path, memory_dir: Path) -> None:
    staging = memory_dir / "staging"
    (staging / "a.json").write_bytes(_doc_bytes(project, "a"))
    (staging / "b.json").write_bytes(_doc_bytes(project, "b"))
    (staging / "f.json").write_bytes(_doc_bytes(project / "elsewhere", "f"))  # foreign


def test_restart_does_not_decide_unchanged_files_again(
    tmp_path: Path, project: Path, memory_dir: Path, spawn: Callable[..., DaemonProcess]
) -> None:
    """A restarted daemon (SIGTERM, then start) takes the files it decided valid or foreign and
    that did not change as decided: no new decision event, counted at `ready` as `unchanged`,
    not as `decided` (issue 31 item 4: this process's decisions only). A file changed while it
    was down, even to the same size and inode, is decided again."""
    _three_files(project, memory_dir)
    args = ("--memory-dir", str(memory_dir), "--settle", "0.5")
    first = spawn(*args, name="first")
    final = first.wait_decided("a.json", "b.json", "f.json")
    assert {n: e["decision"] for n, e in final.items()} == {
        "a.json": "valid",
        "b.json": "valid",
        "f.json": "foreign",
    }
    assert _seen_files(tmp_path) == []  # not written per decision
    first.proc.send_signal(signal.SIGHUP)
    first.wait_for(lambda ev: any(e["event"] == "reload" for e in ev), "a reload")
    assert len(_seen_files(tmp_path)) == 1  # written on SIGHUP
    assert first.stop() == 0

    b = memory_dir / "staging" / "b.json"
    inode = b.stat().st_ino
    with b.open("r+b") as fh:  # in place: same inode, same size, new content ("b" -> "c")
        fh.write(_doc_bytes(project, "c"))
    assert b.stat().st_ino == inode

    second = spawn(*args, name="second")
    assert _decided_names(second) == {"b.json"}
    assert second.decisions("b.json") == ["valid"]
    ready = _event(second, "ready")
    assert ready["decided"] == 1
    assert ready["unchanged"] == 2
    assert second.stop() == 0
    assert _event(second, "stop")["decided"] == 1

    third = spawn(*args, name="third")  # what the second one decided was saved at its stop
    assert _decided_names(third) == set()
    assert _event(third, "ready")["unchanged"] == 3
    assert third.stop() == 0


def test_corrupt_seen_cache_is_ignored(
    tmp_path: Path, project: Path, memory_dir: Path, spawn: Callable[..., DaemonProcess]
) -> None:
    """A seen cache that is not what memstaged wrote costs a re-read of every file, nothing
    else: every file is decided again, READY comes, no traceback."""
    _three_files(project, memory_dir)
    args = ("--memory-dir", str(memory_dir), "--settle", "0.5")
    first = spawn(*args, name="first")
    first.wait_decided("a.json", "b.json", "f.json")
    assert first.stop() == 0
    [cache] = _seen_files(tmp_path)
    cache.write_bytes(b"\x93not msgpack at all" + os.urandom(64))

    second = spawn(*args, name="second")
    assert _decided_names(second) == {"a.json", "b.json", "f.json"}
    assert _event(second, "ready")["unchanged"] == 0
    assert second.stop() == 0
    assert b"Traceback" not in second.stderr_file.read_bytes()
    third = spawn(*args, name="third")  # and the cache written anew at the stop applies
    assert _decided_names(third) == set()
    assert third.stop() == 0


def test_daemon_does_not_decide_again_what_once_decided(
    tmp_path: Path, project: Path, memory_dir: Path, spawn: Callable[..., DaemonProcess]
) -> None:
    """`--once` and the daemon share the seen cache: a daemon started after a `--once` run
    decides only what `--once` left undecided or what changed since."""
    _three_files(project, memory_dir)
    once = spawn("--once", "--memory-dir", str(memory_dir), name="once", ready=False)
    assert once.proc.wait(timeout=30) == 0
    assert _decided_names(once) == {"a.json", "b.json", "f.json"}
    (memory_dir / "staging" / "new.json").write_bytes(_doc_bytes(project, "new"))

    daemon = spawn("--memory-dir", str(memory_dir), "--settle", "0.5")
    assert _decided_names(daemon) == {"new.json"}
    assert _event(daemon, "ready")["unchanged"] == 3
    assert daemon.stop() == 0


def test_dry_run_daemon_writes_no_seen_cache(
    tmp_path: Path, project: Path, memory_dir: Path, spawn: Callable[..., DaemonProcess]
) -> None:
    """--dry-run writes nothing, the seen cache included (as `--once --dry-run`)."""
    _three_files(project, memory_dir)
    daemon = spawn("--memory-dir", str(memory_dir), "--settle", "0.5", "--dry-run")
    daemon.wait_decided("a.json", "b.json", "f.json")
    assert daemon.stop() == 0
    assert _seen_files(tmp_path) == []


# -- a memory dir that is not one ------------------------------------------------------------------


@pytest.mark.usefixtures("plain_output")
def test_the_daemon_refuses_it_too(tmp_path: Path, project: Path) -> None:
    """Issue 13 item 2: the daemon (a real process) exits 2 with one line for a project root,
    instead of running on it."""
    result = subprocess.run(
        memstaged_cmd("--memory-dir", str(project)),
        env=memstaged_env(tmp_path),
        capture_output=True,
        timeout=60,
        check=False,
        cwd=REPO,
    )
    assert result.returncode == 2
    assert len(result.stderr.decode().strip().splitlines()) == 1
    assert b"is not a memory dir" in result.stderr


# -- hostile input ---------------------------------------------------------------------------------


def test_the_daemon_survives_all_of_it(tmp_path: Path) -> None:
    """One daemon over memory dirs full of hostile input (links, FIFOs, sockets, directories,
    empty/deep/non-UTF-8/UTF-16 files, hostile session ids and names, a ``deadletter/`` that is a
    link, a full disk when mounting is permitted): every entry gets the decision SPEC gives it
    with a reason in the log, no error escapes, the file descriptors do not pile up, and a
    file dropped afterwards is still decided."""
    a = make_memory_dir(tmp_path / "a")
    root = project_root_of(a)
    outside = tmp_path / "outside"
    outside.mkdir()
    skipped = special_entries(a, outside)
    quarantined = {
        "empty.json": b"",
        "deep.json": b"[" * 10**6 + b"]" * 10**6,
        "latin1.json": b'{"schemaVersion": "\xe9"}',
        "utf16.json": json.dumps({"a": 1}).encode("utf-16"),
        "traversal.json": malformed(root, "../../../x"),
        "long-session.json": malformed(root, "s" * 100_000),
        ("é" * 125 + ".json"): malformed(root),
    }
    for name, data in quarantined.items():
        put(a / "staging" / name, data)
    c = make_memory_dir(tmp_path / "c")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, c / "deadletter")
    stuck = put(c / "staging" / "stuck.json", malformed(project_root_of(c)))
    env = memstaged_env(tmp_path)
    log = tmp_path / "decisions.jsonl"
    with daemon([a, c], env, "--settle", "0", stderr=tmp_path / "daemon.err") as proc:
        assert wait_for(
            lambda: any(e.get("event") == "ready" for e in read_events(log, strict=False)), 60
        )
        fds = fd_count(proc.pid)
        late = put(a / "staging" / "late.json", repairable(root))

        def decided(name: str, mdir: Path = a) -> list[dict[str, Any]]:
            path = str(mdir / "staging" / name)
            return [
                e
                for e in read_events(log, strict=False)
                if e.get("event") == "decision" and e.get("path") == path
            ]

        assert wait_for(lambda: any(e["decision"] == "repaired" for e in decided("late.json")), 30)
        assert wait_for(lambda: len(decided("stuck.json", c)) >= 2, 30)  # retried, not given up
        assert proc.poll() is None, "the daemon died"
        assert fd_count(proc.pid) <= fds + 4
        for name, reason in skipped.items():
            events = decided(name)
            assert events and events[0]["decision"] == "skipped", (name, events)
            assert reason in events[0]["reasons"][0]
        for name in quarantined:
            events = decided(name)
            assert events and events[-1]["decision"] == "quarantined", (name, events)
            assert events[-1]["reasons"], name
        for event in decided("stuck.json", c):
            assert event["decision"] == "deferred"
            assert "deadletter/ is a symbolic link" in event["reasons"][-1]
        errors = [
            e
            for e in read_events(log, strict=False)
            if e.get("level") == "error" and e.get("path") != str(c / "staging" / "stuck.json")
        ]
        assert not errors, errors
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    assert (c / "staging" / "stuck.json").read_bytes() == stuck
    assert list(elsewhere.iterdir()) == []
    assert (a / "staging" / "late.json").read_bytes() != late
    assert (outside / "outside.json").exists()
    assert not temps_in(a) and not temps_in(c)
    assert "Traceback" not in (tmp_path / "daemon.err").read_text(errors="replace")
