"""``memstaged status``'s side of the control socket: it gets its answer from a busy daemon.

The daemon's side is scripted here (a listening socket at the daemon's path, driven step by
step from the test): that is the only way to force the interleavings below, a connection
closed before the request was read and a wait in ``connect`` cut short by a signal. The real
daemon's side is tested in tests/system/test_health.py.
"""

from __future__ import annotations

import os
import platform
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import msgspec
import pytest
from support.commands import one_line_error, run
from support.waiting import wait_until

from memstaged.daemon import control_socket
from memstaged.errors import Unanswered

#: ``connect``'s system call number, as /proc/<pid>/task/<tid>/syscall shows it.
_CONNECT = {"x86_64": 42, "aarch64": 203}


def _answer(pid: int) -> bytes:
    now = time.time()
    return msgspec.json.encode(
        control_socket.Live(
            pid=pid,
            started=now,
            now=now,
            ready=True,
            status="scripted",
            decided={},
            unchanged=0,
            log_failing=False,
            reload_error=None,
            memory_dirs=[],
        )
    )


@contextmanager
def _listening(tmp_path: Path, backlog: int) -> Iterator[tuple[socket.socket, dict[str, str]]]:
    """A socket where ``status`` looks for this process's daemon, not accepting yet."""
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    env = {"XDG_RUNTIME_DIR": str(runtime)}
    path = control_socket.socket_path(os.getpid(), env)
    assert path is not None
    path.parent.mkdir(mode=0o700)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    fd = os.open(path.parent, os.O_PATH | os.O_DIRECTORY)
    try:
        server.bind(f"/proc/self/fd/{fd}/{path.name}")
    finally:
        os.close(fd)
    server.listen(backlog)
    server.settimeout(60)  # a client that never comes fails the test, not the session
    try:
        yield server, env
    finally:
        server.close()


def _serve_one(server: socket.socket) -> None:
    conn, _ = server.accept()
    with conn:
        conn.recv(64)
        conn.sendall(_answer(os.getpid()))


def _ask_beside(daemon: Callable[[], None], env: dict[str, str]) -> control_socket.Live:
    """``status``'s question, asked while ``daemon`` plays the daemon's side in a thread."""
    side = threading.Thread(target=daemon, daemon=True)
    side.start()
    try:
        return control_socket.ask(os.getpid(), timeout=60, env=env)
    finally:
        side.join(60)


def test_a_connection_closed_before_its_request_is_made_again(tmp_path: Path) -> None:
    """Issue 29 D1: the daemon gives the place of a client silent for 0.25 s to one waiting,
    and closes it; a `status` held up between its `connect` and its request (a loaded machine)
    reported "Broken pipe", CRITICAL. Here the first connection is closed unread: `status`
    connects again and is answered."""
    with _listening(tmp_path, 4) as (server, env):

        def daemon() -> None:
            first, _ = server.accept()
            first.close()  # its place given to another
            _serve_one(server)

        live = _ask_beside(daemon, env)
    assert (live.pid, live.status) == (os.getpid(), "scripted")


def _in_connect(tid: int) -> bool:
    """Whether thread ``tid`` of this process is in the ``connect`` system call now."""
    number = _CONNECT[platform.machine()]
    with open(f"/proc/self/task/{tid}/syscall") as f:
        return f.read().split()[0] == str(number)


def test_a_wait_for_a_place_cut_short_by_a_signal_goes_on(tmp_path: Path) -> None:
    """Issue 29 D2: `status` waits in `connect` for a place in a full listen queue. A signal
    with a handler (a stop and continue, a debugger attaching) cuts that wait short, and Python
    then takes the socket for connected though it is not: the request failed with "Transport
    endpoint is not connected", CRITICAL. Here a signal arrives while `status` waits (the
    thread is seen in `connect`): it waits again, and is answered once a place is free."""
    if platform.machine() not in _CONNECT:
        pytest.skip(f"connect's system call number on {platform.machine()} is not known here")
    main = threading.main_thread().native_id
    assert main is not None
    with _listening(tmp_path, 0) as (server, env):
        path = control_socket.socket_path(os.getpid(), env)
        assert path is not None
        fd = os.open(path.parent, os.O_PATH | os.O_DIRECTORY)
        filler = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        filler.setblocking(False)
        queued = []
        try:
            while True:  # the listen queue is filled: the next connect waits
                try:
                    filler.connect(f"/proc/self/fd/{fd}/{path.name}")
                except BlockingIOError:
                    break
                queued.append(filler)
                filler = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                filler.setblocking(False)
        finally:
            filler.close()
            os.close(fd)
        assert queued
        handled = threading.Event()
        old = signal.signal(signal.SIGUSR1, lambda *_: handled.set())

        def daemon() -> None:
            wait_until(lambda: _in_connect(main), "status waiting in connect", interval=0.001)
            signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGUSR1)
            wait_until(handled.is_set, "the signal handled", interval=0.001)
            time.sleep(0.05)  # not a wait for an event: it lets a broken client fail first
            for _ in queued:
                conn, _ = server.accept()
                conn.close()
            _serve_one(server)

        try:
            live = _ask_beside(daemon, env)
        finally:
            signal.signal(signal.SIGUSR1, old)
            for sock in queued:
                sock.close()
    assert handled.is_set()
    assert live.pid == os.getpid()


@pytest.mark.parametrize("value", ["1e19", "9.3e18", "1.797e308"])
def test_a_timeout_beyond_any_wait_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], memory_dir: Path, value: str
) -> None:
    """Issue 29 (found with D2): `--timeout` of 2**63 s or more ended in a traceback (exit 1):
    it is refused as any duration over 10,000 years is, in one line (exit 2)."""
    code, out, err = run(
        capsys, "status", "--check", "--timeout", value, "--memory-dir", str(memory_dir)
    )
    assert (code, out) == (2, "")
    assert "longer than 10,000 years" in one_line_error(err)


def test_a_daemon_that_always_closes_is_asked_again_a_bounded_number_of_times(
    tmp_path: Path,
) -> None:
    """Issue 29 D1, attacked again: a peer that accepts and closes at once was asked again
    8,000-11,000 times a second for the whole ``--timeout``. It is asked again after a pause
    that doubles (from 10 ms up to a quarter second): a handful of times in a second, and the
    answer is still one line within the timeout."""
    accepted = 0
    with _listening(tmp_path, 16) as (server, env):
        server.settimeout(0.1)

        def daemon() -> None:
            nonlocal accepted
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                try:
                    conn, _ = server.accept()
                except TimeoutError:
                    continue
                except OSError:
                    return  # closed: the test is over
                conn.close()
                accepted += 1

        side = threading.Thread(target=daemon, daemon=True)
        side.start()
        with pytest.raises(Unanswered, match=r"no answer within 1s"):
            control_socket.ask(os.getpid(), timeout=1, env=env)
    assert 1 <= accepted <= 12, accepted
