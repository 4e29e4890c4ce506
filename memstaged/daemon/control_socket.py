"""The daemon's control socket: ``memstaged status`` asks the daemon itself.

A daemon that holds its memory dirs' instance locks but is stopped (``SIGSTOP``) or hung looked
healthy to a status that only read the locks. So the daemon answers ``status`` from the loop that
does the work: a Unix socket ``$XDG_RUNTIME_DIR/memstaged/daemon-<pid>.sock`` (directory 0700,
socket 0600), as ``postfix status`` or ``nginx -s`` talk to their master. A daemon that does not
answer within the client's timeout is reported as not answering.

The answer is made by the loop itself, between two files (:meth:`Control.tick` from
:meth:`memstaged.daemon.loop.Daemon.keepalive`): a loop stuck on a file, or a stopped process,
leaves the client unanswered, which is what the client is there to notice. The kernel completes a
``connect()`` to a listening socket whatever the process does, so the client's timeout covers
connect, request and answer. The loop only looks at its state and encodes it; the sockets are
served by another thread (:mod:`memstaged.daemon.control_clients`), which never blocks either: no
client, silent or not reading, delays the loop or another client.

The answer is one JSON object (:class:`Live`): the daemon's counts, its memory dirs, and for
each the files waiting and since when, read from the daemon's own state, not from the disk.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import os
import socket
import stat
import struct
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Final

import msgspec

from memstaged.daemon.control_clients import BACKLOG, CLIENT_PATIENCE, REQUEST, TOUCH, Clients
from memstaged.errors import Unanswered
from memstaged.files import fsio, private_dirs
from memstaged.patience import poll

if TYPE_CHECKING:
    from memstaged.daemon.loop import Daemon

SOCKET_DIR: Final = "memstaged"
#: How long ``status`` waits for a daemon's answer unless told otherwise (``--timeout``).
DEFAULT_TIMEOUT: Final = 5.0
#: A daemon's answer larger than this is not one (1,000 memory dirs take ~330 KB).
MAX_ANSWER: Final = 64 * 1024 * 1024
#: The loop looks at its state for clients at most once per this many seconds, however many
#: ask and however often (a look takes about 8 ms with 1,000 memory dirs).
ANSWER_EVERY: Final = 0.25


class DirLive(msgspec.Struct, frozen=True, kw_only=True):
    """One memory dir as the daemon holds it."""

    memory_dir: str
    #: staging/ exists and is watched (False with ``staging_exists``: rescans only).
    watched: bool
    staging_exists: bool
    #: Files queued to be decided, and files held back by the reconciler's lock.
    waiting: int
    lock_waiting: int
    #: The oldest last change (mtime, seconds since the epoch) of a waiting file.
    oldest_wait_since: float | None = None


class Live(msgspec.Struct, frozen=True, kw_only=True):
    """The daemon's answer to ``status``."""

    pid: int
    started: float
    now: float
    ready: bool
    status: str
    #: This process's decisions, by decision (:meth:`Daemon.decisions`).
    decided: dict[str, int]
    #: Files taken as decided from the seen cache at start-up.
    unchanged: int
    log_failing: bool
    reload_error: str | None
    memory_dirs: list[DirLive]
    #: Memory dirs the daemon found and could not work on (not watched), with why.
    not_watched: dict[str, str] = {}


def wire(text: str) -> str:
    """``text`` as JSON can carry it: a path that is not UTF-8 (SPEC 6: any name) has lone
    surrogates, which no encoder takes; both ends compare paths in this form."""
    return os.fsencode(text).decode("utf-8", "backslashreplace")


def runtime_dir(env: Mapping[str, str] | None = None) -> Path | None:
    """``$XDG_RUNTIME_DIR/memstaged``; without the variable (a cron job, ``su``), the user's
    ``/run/user/<uid>`` when there is one, so that the daemon and ``status`` still meet there;
    else None."""
    base = (os.environ if env is None else env).get("XDG_RUNTIME_DIR", "")
    if base.startswith("/"):
        return Path(base) / SOCKET_DIR
    fallback = Path(f"/run/user/{os.getuid()}")
    try:
        st = fallback.stat()
    except OSError:
        return None
    return fallback / SOCKET_DIR if st.st_uid == os.getuid() and fallback.is_dir() else None


def socket_path(pid: int, env: Mapping[str, str] | None = None) -> Path | None:
    base = runtime_dir(env)
    return None if base is None else base / f"daemon-{pid}.sock"


def daemon_pids(env: Mapping[str, str] | None = None) -> list[int]:
    """The daemons of this user that have a control socket and are alive (a socket left by a
    killed one names a pid that is gone). None from a runtime dir that is not the user's own
    and private (:func:`memstaged.files.private_dirs.open_private_dir`): another user may have
    named them."""
    base = runtime_dir(env)
    if base is None:
        return []
    try:
        fd = private_dirs.open_private_dir(base, create=False)
    except OSError:
        return []
    try:
        names = os.listdir(fd)
    finally:
        os.close(fd)
    found = []
    for name in names:
        if name.startswith("daemon-") and name.endswith(".sock"):
            pid = name.removeprefix("daemon-").removesuffix(".sock")
            if pid.isdigit() and os.path.exists(f"/proc/{pid}"):
                found.append(int(pid))
    return sorted(found)


def _listening(name: str) -> bool:
    """Whether a process listens on the socket ``name``: the kernel refuses a connection
    (``ECONNREFUSED``) only when none does, as after a daemon was killed (the watchdog's
    SIGABRT, SIGKILL), which leaves its socket behind. The connection is closed at once,
    without a request; a full listen queue, or any other error, counts as listening."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    sock.setblocking(False)
    try:
        sock.connect(name)
    except ConnectionRefusedError:
        return False
    except OSError:
        return True  # EAGAIN: a full queue, someone is there; EACCES: not ours to judge
    finally:
        sock.close()
    return True


def left_sockets(env: Mapping[str, str] | None = None) -> tuple[list[Path], list[Path]]:
    """The control sockets in the runtime dir that no process listens on (left by a killed
    daemon), and those a daemon listens on. None from a runtime dir that is not the user's own
    and private (:func:`memstaged.files.private_dirs.open_private_dir`): another user may have
    put them there."""
    base = runtime_dir(env)
    if base is None:
        return [], []
    try:
        fd = private_dirs.open_private_dir(base, create=False)
    except OSError:
        return [], []
    unheard: list[Path] = []
    heard: list[Path] = []
    try:
        for name in sorted(os.listdir(fd)):
            if not (name.startswith("daemon-") and name.endswith(".sock")):
                continue
            st = fsio.lstat_at(fd, name)
            if st is not None and stat.S_ISSOCK(st.st_mode):
                listening = _listening(f"/proc/self/fd/{fd}/{name}")
                (heard if listening else unheard).append(base / name)
    finally:
        os.close(fd)
    return unheard, heard


def remove_unheard(path: Path) -> bool:
    """Remove the control socket ``path`` if it is still a socket no process listens on
    (through the checked private directory, :func:`fsio.unbind`: never a link or another
    file); whether it did. Raises :class:`OSError`."""
    try:
        with _short_name(path) as name:
            st = os.lstat(name)
            if not stat.S_ISSOCK(st.st_mode) or _listening(name):
                return False
            fsio.unbind(name, (st.st_dev, st.st_ino))
    except FileNotFoundError:
        return False
    return True


@contextlib.contextmanager
def _short_name(path: Path) -> Iterator[str]:
    """``path`` by a name short enough for ``sun_path`` (108 bytes): the directory opened, and
    named through ``/proc/self/fd``, so a deep ``$XDG_RUNTIME_DIR`` (a test's) works too.

    The directory is the user's own and private, checked on the descriptor the name goes
    through (:func:`memstaged.files.private_dirs.open_private_dir`): in a runtime dir that
    others share (a ``su`` session, a wrong ``XDG_RUNTIME_DIR``), a socket another user put
    there is neither bound over nor asked; ``NotPrivate`` (an ``OSError``) says why."""
    fd = private_dirs.open_private_dir(path.parent, create=False)
    try:
        yield f"/proc/self/fd/{fd}/{path.name}"
    finally:
        os.close(fd)


#: The first pause before asking again a daemon that closed the connection unanswered; it
#: doubles up to a quarter of a client's patience, so a peer that always closes costs little.
RETRY_PAUSE: Final = 0.01


def _connect(name: str, deadline: float) -> socket.socket:
    """A socket connected to ``name``, waiting until ``deadline`` for a place in the daemon's
    listen queue.

    A blocking ``connect`` bounded by ``SO_SNDTIMEO``: the kernel wakes it when the daemon
    accepts a connection, and it fails with ``EAGAIN`` (:class:`BlockingIOError`) only once the
    time is up. (A non-blocking one, which ``settimeout`` makes, fails with ``EAGAIN`` at once
    while the queue is full.) A wait cut short by a signal (a stop and continue, a debugger)
    leaves the socket unconnected, though Python then takes it for connected: the peer is
    looked for, and the connect made again on a new socket.
    """
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            whole = int(left)
            micro = max(int((left - whole) * 1e6), 0 if whole else 1)  # 0 would be for ever
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", whole, micro))
            sock.connect(name)
            sock.getpeername()  # ENOTCONN: the wait was cut short by a signal
        except OSError as err:
            sock.close()
            if err.errno in (errno.ENOTCONN, errno.EINTR):
                continue
            raise
        return sock


def _exchange(name: str, deadline: float) -> bytes:
    """Ask once: the whole answer, or ``b""`` when the daemon closed the connection before
    answering (it gives a client's place to another when the client was slow to ask)."""
    sock = _connect(name, deadline)
    try:
        sock.settimeout(max(deadline - time.monotonic(), 0.001))
        try:
            sock.sendall(REQUEST)
        except (BrokenPipeError, ConnectionResetError):
            return b""
        chunks: list[bytes] = []
        size = 0
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            sock.settimeout(left)
            try:
                chunk = sock.recv(1 << 16)
            except ConnectionResetError:
                return b"".join(chunks)  # nothing yet: asked again; part of one: not a status
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            size += len(chunk)
            if size > MAX_ANSWER:
                raise Unanswered("its answer is too large")
    finally:
        sock.close()


def ask(pid: int, timeout: float = DEFAULT_TIMEOUT, env: Mapping[str, str] | None = None) -> Live:
    """The answer of the daemon ``pid``; raises :class:`Unanswered` within ``timeout``.

    A connection closed before any answer came is made again while time is left: the daemon
    closes a client that says nothing for a while, and a client can be held up (a busy
    machine, a stop) between its ``connect`` and its request."""
    path = socket_path(pid, env)
    if path is None:
        raise Unanswered("XDG_RUNTIME_DIR is not set: its control socket cannot be found")
    deadline = time.monotonic() + timeout
    try:
        with _short_name(path) as name:
            # closed unanswered: again, a little later each time
            data = poll(
                lambda: _exchange(name, deadline) or None,
                deadline - time.monotonic(),
                first=RETRY_PAUSE,
                most=CLIENT_PATIENCE / 4,
            )
            if data is None:
                raise TimeoutError
    except (TimeoutError, BlockingIOError):  # BlockingIOError: its listen queue stayed full
        raise Unanswered(f"no answer within {timeout:g}s (stopped or hung)") from None
    except FileNotFoundError:
        raise Unanswered(f"no control socket {path}") from None
    except OSError as err:
        raise Unanswered(f"control socket {path}: {err.strerror or err}") from None
    try:
        return msgspec.json.decode(data, type=Live)
    except msgspec.DecodeError:
        raise Unanswered("its answer is not a status (closed early?)") from None


class Control:
    """The daemon's end: the listening socket, and the answers the loop makes for its clients
    (:mod:`memstaged.daemon.control_clients` serves them)."""

    def __init__(
        self,
        daemon: Daemon,
        path: Path,
        started: float,
        *,
        wake: Callable[[], None],
        touch: Callable[[], None],
    ) -> None:
        """``wake`` puts a WAKE signal on the loop's queue (safe from any thread); ``touch`` is
        called when ``deadletter ack`` says that the marks changed."""
        self.daemon = daemon
        self.path = path
        self.started = started
        #: The last ticket answered, and when the loop may make its next answer.
        self.answered = 0
        self.next_answer = daemon.clock()
        private_dirs.private_dir(path.parent)  # made 0700, or refused if it is not the user's own
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            with _short_name(path) as name:
                self.ident = fsio.bind_private(sock, name)
            sock.listen(BACKLOG)
            self.clients = Clients(sock, wake=wake, touch=touch)
        except OSError:
            sock.close()
            raise

    def tick(self) -> None:
        """Answer every client that asked (from the loop, between two files): the state is
        looked at and encoded here, at most once per :data:`ANSWER_EVERY`, and handed to the
        serving thread, which sends it."""
        asked = self.clients.asked()  # before the look: each of these asked before it
        if asked == self.answered or self.daemon.clock() < self.next_answer:
            return
        self.next_answer = self.daemon.clock() + ANSWER_EVERY
        self.answered = asked
        self.clients.answer(asked, msgspec.json.encode(live(self.daemon, self.started)))

    def deadline(self) -> float | None:
        """When the loop must tick for a client that asked (None: none waits)."""
        return None if self.clients.asked() == self.answered else self.next_answer

    def close(self) -> None:
        """Stop serving and remove the socket (if it is still ours)."""
        self.clients.close()
        with contextlib.suppress(OSError), _short_name(self.path) as name:
            fsio.unbind(name, self.ident)


def touch(pid: int, env: Mapping[str, str] | None = None) -> None:
    """Tell the daemon ``pid`` that dead-letter marks changed; best effort, never waits long."""
    path = socket_path(pid, env)
    if path is None:
        return
    try:
        with _short_name(path) as name:
            sock = _connect(name, time.monotonic() + CLIENT_PATIENCE)
    except OSError:
        return  # no daemon, or a stopped one: its metrics are refreshed at its next event
    try:
        sock.settimeout(CLIENT_PATIENCE)
        sock.sendall(TOUCH)
    except OSError:
        return
    finally:
        sock.close()


def log_failing() -> bool:
    """Whether the decision log file cannot be written now (its sink said so once already)."""
    from memstaged.log import writer

    return writer.file_failing()


def live(daemon: Daemon, started: float) -> Live:
    """The daemon's state now, as :class:`Live` (the loop's thread: nothing changes meanwhile)."""
    waiting: dict[str, list[str]] = collections.defaultdict(list)
    for mdir_path, name in daemon.pending:
        waiting[mdir_path].append(name)
    dirs = []
    for path, mdir in sorted(daemon.mdirs.items()):
        held = daemon.lock_waiting.get(path, set())
        names = [*waiting.get(path, []), *held]
        oldest: float | None = None
        for name in names:
            try:
                mtime = os.stat(os.path.join(mdir.staging, name), follow_symlinks=False).st_mtime
            except (OSError, ValueError):
                continue  # gone meanwhile: it waits for nothing
            oldest = mtime if oldest is None else min(oldest, mtime)
        dirs.append(
            DirLive(
                memory_dir=wire(path),
                watched=daemon.watcher.staging_watched(path),
                staging_exists=os.path.isdir(mdir.staging),
                waiting=len(waiting.get(path, [])),
                lock_waiting=len(held),
                oldest_wait_since=oldest,
            )
        )
    not_watched = {  # a glob's match that is a link is not followed (SPEC 6): not a failure
        wire(path): "cannot be opened"
        for path in daemon.dirs.unopened_logged
        if path not in daemon.mdirs and os.path.realpath(path) == path
    }
    not_watched |= {
        wire(path): "descriptor limit reached"
        for path in daemon.dirs.over_limit
        if path not in daemon.mdirs
    }
    return Live(
        pid=os.getpid(),
        started=started,
        now=time.time(),
        ready=daemon.ready,
        status=daemon.status_text(),
        decided=daemon.decisions(),
        unchanged=daemon.seen.unchanged,
        log_failing=log_failing(),
        reload_error=None if daemon.reload_error is None else wire(daemon.reload_error),
        memory_dirs=dirs,
        not_watched=not_watched,
    )
