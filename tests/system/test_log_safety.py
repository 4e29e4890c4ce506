"""Issue 19 items 1 and 3: nothing is carried out while the decision log cannot be written, and
the log path is a regular file, never one that blocks.

Real file systems fail under real memstaged processes: a small tmpfs (ENOSPC), an ext4 on a loop
device made read-only by ``trigger_fs_error`` (EROFS) or shut down by ``EXT4_IOC_SHUTDOWN`` (EIO).
A test that cannot mount or set up a loop device here is skipped with the reason printed. The
daemon runs on a pseudo-terminal, as a person runs it, so that its readable console line of each
event (the log file cannot have them) says when it deferred a file.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pty
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.commands import mixed_doc
from support.decision_log import read_events
from support.documents import lesson, staging_doc, write
from support.failing_fs import Broken
from support.helpers import (
    REPO,
    make_memory_dir,
    memstaged_cmd,
    memstaged_env,
    mounted,
    project_root_of,
    run_once,
)
from support.waiting import wait_until

from memstaged.core.decide import Context, Decision, decide

OLD = 1_700_000_000


# -- the file systems that fail ------------------------------------------------------------------


def _skip(reason: str) -> None:
    print(reason)
    pytest.skip(reason)


@contextlib.contextmanager
def ext4_on_loop(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A 16 MiB ext4 on a loop device (``errors=remount-ro``), mounted; removed in any case."""
    for tool in ("losetup", "mkfs.ext4", "mount", "umount"):
        if shutil.which(tool) is None:
            _skip(f"no {tool} here: cannot make an ext4 on a loop device")
    if os.geteuid() != 0 or not Path("/dev/loop-control").exists():
        _skip("not root, or no /dev/loop-control: cannot set up a loop device")
    image = tmp_path / "ext4.img"
    with image.open("wb") as fh:
        fh.truncate(16 << 20)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", str(image)], check=True)
    made = subprocess.run(
        ["losetup", "-f", "--show", str(image)], capture_output=True, text=True, check=False
    )
    if made.returncode:
        _skip(f"cannot set up a loop device: {made.stderr.strip()}")
    device = made.stdout.strip()
    try:
        root = tmp_path / "ext4"
        root.mkdir()
        done = subprocess.run(
            ["mount", "-o", "errors=remount-ro", device, str(root)],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode:
            _skip(f"cannot mount an ext4 from {device}: {done.stderr.strip()}")
        try:
            yield root, Path(device).name
        finally:
            subprocess.run(["umount", "-l", str(root)], capture_output=True, check=False)
    finally:
        subprocess.run(["losetup", "-d", device], capture_output=True, check=False)


@pytest.fixture(params=["enospc", "erofs", "eio"])
def broken(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Broken]:
    kind = str(request.param)
    if kind == "enospc":
        root = tmp_path / "small"
        with mounted(root, "-t", "tmpfs", "-o", "size=64k", "tmpfs"):
            yield Broken(kind, root)
    else:
        with ext4_on_loop(tmp_path) as (root, device):
            yield Broken(kind, root, device)


# -- staging files -------------------------------------------------------------------------------


def _populate(mdir: Path) -> dict[str, bytes]:
    """One file repaired (a lesson without triggers) and one quarantined; name -> bytes."""
    root = project_root_of(mdir)
    staging = mdir / "staging"
    files = {
        "repair.json": write(
            staging / "repair.json",
            staging_doc(root, "s1", candidates={"lessons": [lesson(triggers=[])]}),
        ),
        "quarantine.json": write(staging / "quarantine.json", staging_doc(root, schemaVersion="1")),
    }
    for name in files:
        os.utime(staging / name, (OLD, OLD))
    return files


def _unchanged(mdir: Path, files: dict[str, bytes]) -> None:
    """Nothing carried out: every file byte for byte in staging/, nothing in deadletter/."""
    for name, data in files.items():
        assert (mdir / "staging" / name).read_bytes() == data, name
    assert not any((mdir / "deadletter").rglob("*.json"))


def _carried_out(mdir: Path, files: dict[str, bytes], log: Path) -> None:
    """Both decisions carried out, and each logged with the sha256 of the bytes decided on."""
    repaired = (mdir / "staging" / "repair.json").read_bytes()
    assert repaired != files["repair.json"]
    ctx = Context(project_root=project_root_of(mdir), file_name="repair.json")
    assert decide(repaired, ctx).decision is Decision.VALID
    assert not (mdir / "staging" / "quarantine.json").exists()
    originals = [p.read_bytes() for p in (mdir / "deadletter" / "originals").iterdir()]
    assert originals == [files["quarantine.json"]]
    logged = {
        (Path(e["path"]).name, e["decision"], e["sha256"])
        for e in read_events(log, strict=False)
        if e.get("event") == "decision" and "planned" not in e
    }
    for name, decision in (("repair.json", "repaired"), ("quarantine.json", "quarantined")):
        assert (name, decision, hashlib.sha256(files[name]).hexdigest()) in logged


# -- --once --------------------------------------------------------------------------------------


def test_once_carries_nothing_out_while_the_log_cannot_be_written(
    tmp_path: Path, broken: Broken
) -> None:
    """Issue 19 item 1: with the log on a full, read-only or failing file system, ``--once``
    changes nothing, exits 1 with one line naming the log's error; once the log can be written
    again the next run decides both files, and the log has both decisions."""
    mdir = make_memory_dir(tmp_path / "projects")
    files = _populate(mdir)
    env = memstaged_env(tmp_path, MEMSTAGED_LOG_FILE=str(broken.log))
    broken.break_it()

    done = run_once(mdir, env, "--settle", "0")
    err = done.stderr.decode().splitlines()
    assert done.returncode == 1, err
    assert len(err) == 1 and f"({broken.errno_name})" in err[0], err
    assert "decision log" in err[0]
    _unchanged(mdir, files)

    broken.mend()
    done = run_once(mdir, env, "--settle", "0")
    assert done.returncode == 0, done.stderr
    _carried_out(mdir, files, broken.log)


# -- the daemon ----------------------------------------------------------------------------------


class Terminal:
    """A pseudo-terminal a process writes to; what it printed, read as it comes."""

    def __init__(self) -> None:
        self.master, self.slave = pty.openpty()
        self._text = b""
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:
                return  # EIO: the last process holding the other end has exited
            if not chunk:
                return
            with self._lock:
                self._text += chunk

    def text(self) -> str:
        with self._lock:
            return self._text.decode(errors="replace")

    def wait_for(self, proc: subprocess.Popen[bytes], *needles: str, timeout: float) -> str:
        """Until every needle has been printed (the daemon must not exit meanwhile)."""
        wait_until(
            lambda: all(n in self.text() for n in needles),
            f"{needles} on the terminal",
            timeout=timeout,
            alive=proc,
            said=self.text,
        )
        return self.text()


@contextlib.contextmanager
def daemon_on_terminal(
    mdir: Path, env: dict[str, str], terminal: Terminal
) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(
        memstaged_cmd("--memory-dir", str(mdir), "--settle", "0.2"),
        env={**env, "NO_COLOR": "1", "TERM": "xterm"},
        stdin=subprocess.DEVNULL,
        stdout=terminal.slave,
        stderr=terminal.slave,
        cwd=REPO,
    )
    os.close(terminal.slave)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        os.close(terminal.master)


def _logged(log: Path, name: str, decision: str) -> bool:
    return any(
        e.get("event") == "decision"
        and Path(e.get("path", "")).name == name
        and e.get("decision") == decision
        and "planned" not in e
        for e in read_events(log, strict=False)
    )


def test_the_daemon_defers_while_the_log_cannot_be_written_and_recovers_by_itself(
    tmp_path: Path, broken: Broken
) -> None:
    """Issue 19 item 1: the daemon's log becomes unwritable (full, read-only, EIO) while it
    runs; a file to repair and one to quarantine arrive: both are deferred (said on the
    terminal: the log file cannot have it), nothing is carried out, and the failure is said
    once on stderr. Once the log can be written again, the daemon
    decides both by itself (the existing backoff) and the log has both decisions."""
    mdir = make_memory_dir(tmp_path / "projects")
    env = memstaged_env(tmp_path, MEMSTAGED_LOG_FILE=str(broken.log))
    terminal = Terminal()
    with daemon_on_terminal(mdir, env, terminal) as proc:
        terminal.wait_for(proc, "ready", timeout=30)
        broken.break_it()
        files = _populate(mdir)
        staging = mdir / "staging"
        text = terminal.wait_for(
            proc,
            f"deferred {staging / 'repair.json'}: ",
            f"deferred {staging / 'quarantine.json'}: ",
            timeout=30,
        )
        _unchanged(mdir, files)
        said = [line for line in text.splitlines() if "nothing is carried out while" in line]
        assert len(said) == 1 and f"({broken.errno_name})" in said[0], text

        broken.mend()
        deadline = time.monotonic() + 60  # the backoff after a few failures: seconds
        while not (  # logged, then carried out: both
            _logged(broken.log, "repair.json", "repaired")
            and _logged(broken.log, "quarantine.json", "quarantined")
            and not (mdir / "staging" / "quarantine.json").exists()
            and (mdir / "staging" / "repair.json").read_bytes() != files["repair.json"]
        ):
            assert proc.poll() is None, terminal.text()
            assert time.monotonic() < deadline, terminal.text()
            time.sleep(0.05)
        _carried_out(mdir, files, broken.log)
        assert "works again" in terminal.text()


# -- recover and purge ---------------------------------------------------------------------------


def test_recover_changes_nothing_while_the_log_cannot_be_written(tmp_path: Path) -> None:
    """Issue 19 item 1: ``deadletter recover`` writes the same log; on a full one it refuses
    with one line and exit 1, and every record stays where it is; with room again it recovers."""
    mdir = make_memory_dir(tmp_path / "projects")
    root = project_root_of(mdir)
    write(mdir / "staging" / "mixed.json", mixed_doc(Path(root)))
    os.utime(mdir / "staging" / "mixed.json", (OLD, OLD))
    small = tmp_path / "small"
    with mounted(small, "-t", "tmpfs", "-o", "size=64k", "tmpfs"):
        log = Broken("enospc", small)
        env = memstaged_env(tmp_path, MEMSTAGED_LOG_FILE=str(log.log))
        assert run_once(mdir, env, "--settle", "0").returncode == 0
        before = {p: p.read_bytes() for p in sorted(mdir.rglob("*")) if p.is_file()}
        assert any("deadletter" in str(p) for p in before)
        recover = memstaged_cmd("deadletter", "recover", "--all", "--memory-dir", str(mdir))
        log.break_it()
        done = subprocess.run(recover, env=env, capture_output=True, timeout=120, check=False)
        err = done.stderr.decode().splitlines()
        assert done.returncode == 1, err
        assert len(err) == 1, err
        assert err[0].startswith(f"memstaged: the decision log {log.log} cannot be written: ")
        assert "(ENOSPC); nothing more was changed" in err[0]
        assert {p: p.read_bytes() for p in sorted(mdir.rglob("*")) if p.is_file()} == before

        log.mend()
        done = subprocess.run(recover, env=env, capture_output=True, timeout=120, check=False)
        assert (mdir / "staging" / "mixed.recovered-1.json").exists(), done.stderr
        assert any(
            e.get("event") == "deadletter_recovering" for e in read_events(log.log, strict=False)
        )


# -- item 3: what the log path may be ------------------------------------------------------------

COMMANDS = [
    ["--once"],
    [],  # the daemon
    ["log"],
    ["stats"],
    ["status"],
    ["deadletter", "list"],
]


@pytest.mark.parametrize("kind", ["fifo", "dev-null", "socket"])
@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "daemon")
def test_a_log_path_that_is_not_a_regular_file_is_refused_by_every_command(
    tmp_path: Path, kind: str, command: list[str]
) -> None:
    """Issue 19 item 3: a FIFO nobody reads, ``/dev/null`` or a socket as ``MEMSTAGED_LOG_FILE``:
    every command refuses it at once with one line and exit 2, and changes nothing (a FIFO
    used to block ``--once``, ``log`` and ``stats`` for ever; ``/dev/null`` kept nothing)."""
    mdir = make_memory_dir(tmp_path / "projects")
    files = _populate(mdir)
    path = tmp_path / "decisions.jsonl"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        server = socket.socket(socket.AF_UNIX)
        server.bind(str(path))
        server.close()
    else:
        path = Path("/dev/null")
    env = memstaged_env(tmp_path, MEMSTAGED_LOG_FILE=str(path))
    done = subprocess.run(
        memstaged_cmd(*command, "--memory-dir", str(mdir)),
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=60,  # a failure guard: refused at once, or it blocks
        check=False,
        cwd=REPO,
    )
    err = done.stderr.decode().splitlines()
    assert done.returncode == 2, (done.returncode, err)
    assert err == [f"memstaged: log file {path}: {_not_regular(kind)}"], err
    _unchanged(mdir, files)


def _not_regular(kind: str) -> str:
    what = {"fifo": "a FIFO", "socket": "a socket", "dev-null": "a character device"}[kind]
    return (
        f"not a regular file ({what}): the decision log must be a regular file, or a path where "
        "one can be created"
    )


def test_a_fifo_among_the_rotated_logs_does_not_block_the_reader(tmp_path: Path) -> None:
    """Issue 19 item 3: ``decisions.jsonl.1`` a FIFO (the config check sees only the file
    itself): ``memstaged log`` refuses it with one line and exit 2 instead of blocking."""
    log = tmp_path / "decisions.jsonl"
    log.write_text(json.dumps({"event": "start", "timestamp": "2026-12-01T00:00:00Z"}) + "\n")
    os.mkfifo(f"{log}.1")
    env = memstaged_env(tmp_path, MEMSTAGED_LOG_FILE=str(log))
    done = subprocess.run(
        memstaged_cmd("log"),
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=60,  # a failure guard
        check=False,
        cwd=REPO,
    )
    err = done.stderr.decode().splitlines()
    assert done.returncode == 2, err
    assert err == [f"memstaged: log file {log}.1: {_not_regular('fifo')}"], err


# -- a log locked by a stopped process -----------------------------------------------------------


def test_once_waits_a_bounded_time_for_a_log_another_process_holds_locked(tmp_path: Path) -> None:
    """Issue 19, found by the recover/purge attack: every append takes the log's ``flock``, and
    a memstaged stopped while holding it (Ctrl-Z on a ``--once`` in the middle of its events)
    made every other memstaged wait in ``flock`` for ever: the daemon with
    ``canonical-writer.lock`` in hand, against SPEC 5's second. A real process holds the lock
    and is stopped with SIGSTOP; ``--once`` gives up after ``LOCK_PATIENCE``, carries nothing out
    and exits 1 with one line; once the holder is gone, the next run decides both files."""
    mdir = make_memory_dir(tmp_path / "projects")
    files = _populate(mdir)
    log = tmp_path / "state" / "decisions.jsonl"
    log.parent.mkdir()
    log.write_bytes(b"")
    env = memstaged_env(tmp_path, MEMSTAGED_LOG_FILE=str(log))
    holder = subprocess.Popen(
        [
            "python3",
            "-c",
            "import fcntl, os, signal, sys\n"
            "fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\n"
            "print('locked', flush=True)\n"
            "os.kill(os.getpid(), signal.SIGSTOP)\n",
            str(log),
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == b"locked\n"
        done = run_once(mdir, env, "--settle", "0")
        err = done.stderr.decode().splitlines()
        assert done.returncode == 1, err
        assert len(err) == 1 and "locked by another process" in err[0], err
        _unchanged(mdir, files)
    finally:
        holder.kill()
        holder.wait()
        if holder.stdout is not None:
            holder.stdout.close()
    done = run_once(mdir, env, "--settle", "0")
    assert done.returncode == 0, done.stderr
    _carried_out(mdir, files, log)
