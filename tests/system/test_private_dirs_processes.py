"""The directories memstaged keeps its own files in (issue 29 item 11): its state dir (the seen
cache, the ack marks, the instance locks, by default the decision log) and its control socket's
directory are used only when they are the user's own and private, as ssh refuses a directory
that is not; a refusal is one line.

Another user is the real ``nobody``: a directory it owns is made with ``os.chown`` (as root),
under /tmp, which it reaches; the daemon is a real process, stopped with a real SIGSTOP, asked by
a real ``memstaged status`` through a real socket. The check itself
(``private_dirs.private_dir``) is in ``tests/files/test_private_dirs.py``.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from support import as_nobody
from support.commands import one_line_error, prepare, record_files, run, staging_files
from support.daemon_process import DaemonProcess
from support.decision_log import read_events
from support.documents import one_of_each
from support.helpers import REPO, daemon, memory_dir_of, memstaged_cmd, memstaged_env
from support.waiting import wait_for

from memstaged import config
from memstaged.daemon import control_socket
from memstaged.deadletter import acks

pytestmark = pytest.mark.usefixtures("plain_output")

REFUSED = "bad ownership or modes for directory"


@contextlib.contextmanager
def _shared_dir() -> Iterator[Path]:
    """A directory every user may create in (sticky, as /tmp): a runtime dir that others share
    (a ``su`` session, a wrong ``XDG_RUNTIME_DIR``). Under /tmp, which ``nobody`` reaches."""
    base = Path(tempfile.mkdtemp(prefix="memstaged-shared-", dir="/tmp"))
    try:
        os.chmod(base, 0o1777)  # noqa: S103 - shared, as the issue's runtime dir is
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


# -- the runtime dir: a socket another user put there is not asked -------------------------------


@contextlib.contextmanager
def _fake_daemon(path: Path, answer: bytes) -> Iterator[None]:
    """A socket at ``path`` answering every request with ``answer``: what the user who owns the
    directory could put there in place of the daemon's."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    os.chown(path, path.parent.stat().st_uid, -1)
    server.listen(8)

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return  # closed: the test is over
            with conn:
                conn.recv(64)
                conn.sendall(answer)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.shutdown(socket.SHUT_RDWR)
        server.close()
        thread.join(10)


def _process_state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().rsplit(")", 1)[1].split()[0]


def test_a_stopped_daemon_is_not_reported_ok_through_another_users_runtime_dir(
    tmp_path: Path, memory_dir: Path
) -> None:
    """Issue 29 item 11: in a runtime dir that others share, ``memstaged/`` was made first by
    ``nobody``. The daemon serves no socket there (it logs why, and works on); a socket that
    user put in the daemon's place is not asked: with the daemon SIGSTOPped, ``status --check
    --require-daemon`` is CRITICAL, naming the directory, its owner and its mode. It was
    ``MEMSTAGED OK`` with the text that user wrote."""
    uid = as_nobody.owner_ids()[0]
    with _shared_dir() as runtime:
        theirs = as_nobody.made_by(runtime / control_socket.SOCKET_DIR, uid, 0o777)
        daemon = DaemonProcess(
            tmp_path, "--memory-dir", str(memory_dir), env={"XDG_RUNTIME_DIR": str(runtime)}
        )
        try:
            daemon.wait_ready()
            [failed] = [e for e in daemon.events() if e["event"] == "control_failed"]
            assert failed["error"].startswith(f"{REFUSED} {theirs} (owner nobody, mode 0777)")
            here = control_socket.wire(str(memory_dir))
            spoof = control_socket.Live(
                pid=daemon.proc.pid,
                started=time.time(),
                now=time.time(),
                ready=True,
                status="all is well, says nobody",
                decided={},
                unchanged=0,
                log_failing=False,
                reload_error=None,
                memory_dirs=[
                    control_socket.DirLive(
                        memory_dir=here,
                        watched=True,
                        staging_exists=True,
                        waiting=0,
                        lock_waiting=0,
                    )
                ],
            )
            sock = theirs / f"daemon-{daemon.proc.pid}.sock"
            with _fake_daemon(sock, msgspec.json.encode(spoof)):
                daemon.proc.send_signal(signal.SIGSTOP)
                assert wait_for(lambda: _process_state(daemon.proc.pid) == "T", 60)
                env = memstaged_env(
                    tmp_path,
                    XDG_RUNTIME_DIR=str(runtime),
                    MEMSTAGED_LOG_FILE=str(daemon.log_file),
                )
                check = subprocess.run(
                    memstaged_cmd(
                        "status", "--check", "--require-daemon", "--memory-dir", str(memory_dir)
                    ),
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=120,
                    check=False,
                )
            assert check.returncode == 2, check.stdout
            assert check.stdout.startswith("MEMSTAGED CRITICAL - "), check.stdout
            assert f"{REFUSED} {theirs} (owner nobody, mode 0777)" in check.stdout
            assert "says nobody" not in check.stdout
        finally:
            daemon.proc.send_signal(signal.SIGCONT)
            daemon.kill()


# -- the state dir: refused, with one line, by every command that trusts it ---------------------


@pytest.fixture
def spoofed_state(
    tmp_path: Path, project: Path, memory_dir: Path, log_file: Path
) -> tuple[Path, dict[str, bytes]]:
    """A memory dir with dead-letter records, and a state dir that ``nobody`` made first, in
    which that user marked every record seen (so that no monitor would ask about them)."""
    uid = as_nobody.owner_ids()[0]
    prepare(project, memory_dir, log_file)
    os.utime(memory_dir / "staging" / "good.json", (1, 1))
    state = config.default_state_dir(os.environ)
    shutil.rmtree(state, ignore_errors=True)
    state.mkdir(mode=0o700)
    acks.mark(state, memory_dir_of(memory_dir), None)  # every record, as nobody would
    for path in [state, *state.rglob("*")]:
        os.chown(path, uid, uid)
    os.chmod(state, 0o777)  # noqa: S103 - what nobody would make
    assert record_files(memory_dir)
    return state, staging_files(memory_dir)


@pytest.mark.parametrize(
    "argv",
    [
        ["status", "--check"],
        ["status"],
        ["--once"],
        ["deadletter", "ack", "--all"],
    ],
    ids=" ".join,
)
def test_another_users_state_dir_is_refused_in_one_line(
    capsys: pytest.CaptureFixture[str],
    spoofed_state: tuple[Path, dict[str, bytes]],
    memory_dir: Path,
    argv: list[str],
) -> None:
    """Issue 29 item 11: a state dir that another user made first is trusted by no command:
    ``status --check`` was OK, every dead-letter record hidden by that user's marks; now it is
    UNKNOWN (exit 3, the check cannot be made), and ``status``, ``--once`` and ``deadletter
    ack`` exit 2, each with one line naming the directory, its owner and its mode; nothing is
    changed."""
    state, staged = spoofed_state
    before = sorted(p.name for p in state.rglob("*"))
    code, out, err = run(capsys, *argv, "--memory-dir", str(memory_dir))
    why = (
        f"state dir: {REFUSED} {state} (owner nobody, mode 0777): it must be "
        f"{pwd.getpwuid(os.geteuid()).pw_name}'s own, mode 0700"
    )
    if "--check" in argv:
        assert (code, out, err) == (3, f"MEMSTAGED UNKNOWN - {why}\n", "")
    else:
        assert code == 2
        assert one_line_error(err) == f"memstaged: {why}"
    assert staging_files(memory_dir) == staged
    assert sorted(p.name for p in state.rglob("*")) == before


@pytest.mark.parametrize(
    "argv",
    [["status", "--check"], ["status"], ["--once"], ["deadletter", "ack", "--all"]],
    ids=" ".join,
)
def test_a_state_dir_in_another_users_directory_is_refused_in_one_line(
    capsys: pytest.CaptureFixture[str],
    project: Path,
    memory_dir: Path,
    log_file: Path,
    argv: list[str],
) -> None:
    """Issue 29 D3: the state dir was the user's own and private, but in a directory
    (``$XDG_STATE_HOME``) that ``nobody`` owns. That user may rename it away and put a link in
    its place at any time, after memstaged checked it: the seen cache and the marks were then
    written into that user's directory, and read from it. Every command now refuses such a
    state dir, as ssh refuses a key below a directory others own, with one line naming the
    directory above it; nothing is changed."""
    uid = as_nobody.owner_ids()[0]
    prepare(project, memory_dir, log_file)
    state = config.default_state_dir(os.environ)
    assert stat.S_IMODE(state.stat().st_mode) == 0o700 and state.stat().st_uid == os.geteuid()
    os.chown(state.parent, uid, uid)
    os.chmod(state.parent, 0o755)  # noqa: S103 - theirs, as a home others may enter
    before = {p: p.read_bytes() for p in state.rglob("*") if p.is_file()}
    staged = staging_files(memory_dir)
    code, out, err = run(capsys, *argv, "--memory-dir", str(memory_dir))
    why = (
        f"state dir: {REFUSED} {state.parent} above {state} (owner nobody, mode 0755): "
        "another user could replace what is below it"
    )
    if "--check" in argv:
        assert (code, out, err) == (3, f"MEMSTAGED UNKNOWN - {why}\n", "")
    else:
        assert code == 2
        assert one_line_error(err) == f"memstaged: {why}"
    assert staging_files(memory_dir) == staged
    assert {p: p.read_bytes() for p in state.rglob("*") if p.is_file()} == before


def test_the_users_own_state_dir_others_may_write_is_refused_by_the_daemon(
    tmp_path: Path, memory_dir: Path
) -> None:
    """Issue 29 item 11: the daemon refuses a state dir that is its user's but that others
    may write (exit 2, one line), before it takes any instance lock or decides anything."""
    env = memstaged_env(tmp_path / "work")
    state = Path(env["XDG_STATE_HOME"]) / "memstaged"
    state.mkdir(parents=True)
    os.chmod(state, 0o775)  # noqa: S103 - what is refused
    log = Path(env["MEMSTAGED_LOG_FILE"])
    with daemon([memory_dir], env, stderr=tmp_path / "daemon.err") as proc:
        assert wait_for(
            lambda: (
                proc.poll() is not None
                or any(e.get("event") == "ready" for e in read_events(log, strict=False))
            ),
            120,
        )
        assert proc.poll() == 2, "the daemon started"
    assert f"state dir: {REFUSED} {state} (owner " in one_line_error(
        (tmp_path / "daemon.err").read_text()
    )
    assert list(state.iterdir()) == []


# -- what memstaged creates is 0700 ----------------------------------------------------------------


def test_every_directory_memstaged_creates_is_0700(
    tmp_path: Path, project: Path, memory_dir: Path
) -> None:
    """Issue 10 item 17 (SPEC 6): with ``$XDG_STATE_HOME`` not there yet, each directory
    memstaged creates for its state (the parents too) is 0700, whatever the umask."""
    one_of_each(project, memory_dir)
    state = tmp_path / "new" / "state"
    env = memstaged_env(tmp_path, XDG_STATE_HOME=str(state))
    env.pop("MEMSTAGED_LOG_FILE")
    result = subprocess.run(
        [
            "sh",
            "-c",
            'umask 022; exec "$@"',
            "sh",
            *memstaged_cmd("--once", "--memory-dir", str(memory_dir)),
        ],
        env=env,
        capture_output=True,
        timeout=60,
        check=False,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr
    created = [tmp_path / "new", state, state / "memstaged", state / "memstaged" / "seen"]
    modes = {str(p.relative_to(tmp_path)): stat.S_IMODE(p.stat().st_mode) for p in created}
    assert modes == {k: 0o700 for k in modes}
