"""The control socket's clients, served by one thread that never waits on any of them.

The work loop makes each answer (:class:`memstaged.daemon.control_socket.Control`); everything else
happens here, in the ``memstaged-control`` thread: accepting connections, reading requests, writing
answers. Every socket is non-blocking and the thread waits only in ``poll()``, on the listening
socket, the clients and an ``eventfd`` by which the loop hands an answer over; an idle daemon
sets no timer. The bounds:

- a client has :data:`CLIENT_PATIENCE` to send its request, and as long again to take its
  answer once the loop made it; then it is closed;
- at most :data:`MAX_CLIENTS` are served at once; newcomers wait in the kernel's listen queue,
  costing no descriptor, until a place is free. A client that has said nothing for
  :data:`SILENT_GRACE` gives its place up to one waiting there (it is closed); one that has
  just connected keeps it, since an honest client is silent only between its ``connect`` and
  its ``send``.

A request is numbered when it is read (a *ticket*). The loop answers every ticket issued before
it looked at its state, in one :meth:`Clients.answer`: one encoded answer, shared by all the
clients it answers, and never a write from the loop's thread.
"""

from __future__ import annotations

import contextlib
import enum
import errno
import os
import select
import selectors
import socket
import threading
import time
from collections.abc import Callable
from typing import Final

#: The one request that gets an answer, and the one that is a notice (no answer).
REQUEST: Final = b"status\n"
TOUCH: Final = b"touch\n"
#: How long a client has to send its request, and then to take its answer.
CLIENT_PATIENCE: Final = 1.0
#: Clients served at once (each holds a descriptor: docs/daemon.md counts them in the reserve).
MAX_CLIENTS: Final = 4
#: How long a client that has said nothing keeps its place from a connection waiting for one.
SILENT_GRACE: Final = 0.25
#: The listen queue: connections not accepted yet (they hold no descriptor of the daemon's).
BACKLOG: Final = 16


class Phase(enum.Enum):
    READ = "read"  # its request is awaited
    WAIT = "wait"  # it asked: the loop has not answered yet
    SEND = "send"  # its answer is being written
    DONE = "done"  # closed


class Client:
    """One connection, from its request to the last byte of its answer."""

    def __init__(self, conn: socket.socket, deadline: float) -> None:
        self.conn = conn
        self.phase = Phase.READ
        #: Until when it keeps its place while silent, and when it is closed if still silent.
        self.grace = deadline - CLIENT_PATIENCE + SILENT_GRACE
        self.deadline: float | None = deadline
        self.request = b""
        self.ticket = 0
        self.answer = memoryview(b"")
        self.sent = 0


class Clients:
    """The serving thread, and what it shares with the loop: the tickets and the answer."""

    def __init__(
        self, sock: socket.socket, *, wake: Callable[[], None], touch: Callable[[], None]
    ) -> None:
        """``sock`` is listening; ``wake`` tells the loop that a client asked; ``touch`` is
        called for a ``touch`` request (from this thread: it only sets a flag)."""
        self.sock = sock
        self.wake = wake
        self.touch = touch
        self.clients: list[Client] = []
        self.lock = threading.Lock()
        self.tickets = 0  # the last ticket issued (under the lock)
        self.handed: tuple[int, bytes] | None = None  # the loop's last answer (under the lock)
        self.answered = 0  # the last ticket given an answer (this thread only)
        self.closing = False
        self.accepting = True
        self.resume_accepting: float | None = None
        #: The pause is for want of a descriptor (EMFILE), not of a place: a freed place does
        #: not end it.
        self.starved = False
        self.event = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self.selector = selectors.PollSelector()  # poll() holds no descriptor, epoll would
        self.sock.setblocking(False)
        #: Whether a connection waits to be accepted (asked before a silent client is closed).
        self.pending = select.poll()
        self.pending.register(self.sock, select.POLLIN)
        self.selector.register(self.sock, selectors.EVENT_READ)
        self.selector.register(self.event, selectors.EVENT_READ)
        self.thread = threading.Thread(target=self._serve, name="memstaged-control", daemon=True)
        try:
            self.thread.start()
        except RuntimeError:  # no thread left (ulimit -u): said as the socket's failure
            os.close(self.event)
            raise OSError(errno.EAGAIN, "cannot start its thread") from None

    # -- the loop's side ------------------------------------------------------------------------

    def asked(self) -> int:
        """The last ticket issued: every request read so far has this one or a lower one."""
        with self.lock:
            return self.tickets

    def answer(self, ticket: int, data: bytes) -> None:
        """Hand ``data`` over as the answer to every ticket up to ``ticket``; never blocks."""
        with self.lock:
            self.handed = (ticket, data)
        os.eventfd_write(self.event, 1)

    def close(self) -> None:
        """Stop serving: every client and the listening socket are closed by the thread."""
        self.closing = True
        os.eventfd_write(self.event, 1)
        self.thread.join(CLIENT_PATIENCE)
        if not self.thread.is_alive():
            os.close(self.event)

    # -- the serving thread ---------------------------------------------------------------------

    def _serve(self) -> None:
        try:
            while not self.closing:
                for key, _ in self.selector.select(self._timeout()):
                    if key.fileobj is self.sock:
                        self._accept()
                    elif key.fileobj == self.event:
                        self._take_answer()
                    elif isinstance(key.data, Client):
                        self._step(key.data)
                self._expire()
        finally:
            for client in list(self.clients):
                self._drop(client)
            self.selector.close()
            self.sock.close()

    def _timeout(self) -> float | None:
        deadlines = [c.deadline for c in self.clients if c.deadline is not None]
        if self.resume_accepting is not None:
            deadlines.append(self.resume_accepting)
        return max(min(deadlines) - time.monotonic(), 0.0) if deadlines else None

    def _accept(self) -> None:
        """Take every connection waiting, while there is room for it."""
        while self.pending.poll(0):
            if not self._room():
                return
            try:
                conn, _ = self.sock.accept()
            except BlockingIOError:
                return
            except ConnectionAbortedError:
                continue  # gone before it was accepted
            except OSError:  # no descriptor left (EMFILE): try again a little later
                self._stop_accepting(until=time.monotonic() + CLIENT_PATIENCE, starved=True)
                return
            conn.setblocking(False)
            client = Client(conn, time.monotonic() + CLIENT_PATIENCE)
            self.clients.append(client)
            self.selector.register(conn, selectors.EVENT_READ, client)
            self._read(client)  # a client that sent its request with its connect is served now

    def _room(self) -> bool:
        """Whether one more client can be served now: a place is free, or one is held by a
        client silent past its grace (it is closed). Else accepting pauses until a place is
        freed or the first grace ends."""
        if len(self.clients) < MAX_CLIENTS:
            return True
        now = time.monotonic()
        silent = [c for c in self.clients if c.phase is Phase.READ]
        if silent and silent[0].grace <= now:  # the oldest silent one: accepted first
            self._drop(silent[0])
            return True
        self._stop_accepting(until=silent[0].grace if silent else None, starved=False)
        return False

    def _stop_accepting(self, until: float | None, *, starved: bool) -> None:
        """Leave connections in the listen queue until a place is free (or until ``until``)."""
        if self.accepting:
            self.selector.unregister(self.sock)
            self.accepting = False
        self.resume_accepting = until
        self.starved = starved

    def _start_accepting(self) -> None:
        if not self.accepting and not self.closing:
            self.selector.register(self.sock, selectors.EVENT_READ)
            self.accepting = True
            self.resume_accepting = None
            self.starved = False

    def _step(self, client: Client) -> None:
        if client.phase is Phase.READ:
            self._read(client)
        elif client.phase is Phase.SEND:
            self._send(client)

    def _read(self, client: Client) -> None:
        """Read what came of the request; act on it once it is a whole line (or too long)."""
        try:
            data = client.conn.recv(len(REQUEST) - len(client.request))
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._drop(client)  # gone before it said what it wants
            return
        client.request += data
        if not client.request.endswith(b"\n") and len(client.request) < len(REQUEST):
            return
        if client.request == REQUEST:
            self._wait_for_loop(client)
            return
        self._drop(client)
        if client.request == TOUCH:
            self.touch()
            self.wake()

    def _wait_for_loop(self, client: Client) -> None:
        with self.lock:
            self.tickets += 1
            client.ticket = self.tickets
        self.selector.unregister(client.conn)
        client.phase = Phase.WAIT
        client.deadline = None  # the loop's time: a stopped loop is what the client detects
        self.wake()

    def _take_answer(self) -> None:
        """The loop answered (or :meth:`close` was called): start sending to those it answered."""
        with contextlib.suppress(BlockingIOError):
            os.eventfd_read(self.event)
        with self.lock:
            handed, self.handed = self.handed, None
        if handed is None or handed[0] <= self.answered:
            return
        self.answered, data = handed
        answer = memoryview(data)
        for client in list(self.clients):
            if client.phase is Phase.WAIT and client.ticket <= self.answered:
                client.phase = Phase.SEND
                client.answer = answer
                client.deadline = time.monotonic() + CLIENT_PATIENCE
                self.selector.register(client.conn, selectors.EVENT_WRITE, client)
                self._send(client)

    def _send(self, client: Client) -> None:
        """Write as much of the answer as the socket takes now; close once it is all sent."""
        try:
            client.sent += client.conn.send(client.answer[client.sent :])
        except BlockingIOError:
            return
        except OSError:
            self._drop(client)  # the client gave up: it reports the daemon as not answering
            return
        if client.sent == len(client.answer):
            self._drop(client)

    def _expire(self) -> None:
        """Close every client past its deadline; accept again once a pause is over."""
        now = time.monotonic()
        for client in list(self.clients):
            if client.deadline is not None and now >= client.deadline:
                self._drop(client)
        if self.resume_accepting is not None and now >= self.resume_accepting:
            self._start_accepting()

    def _drop(self, client: Client) -> None:
        if client.phase is Phase.DONE:
            return  # closed already, earlier in the same round of events
        if client.phase is not Phase.WAIT:
            self.selector.unregister(client.conn)
        client.conn.close()
        client.phase = Phase.DONE
        self.clients.remove(client)
        if not self.starved:
            self._start_accepting()  # a place is free: the listen queue is served again
