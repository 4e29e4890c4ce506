"""A decider process's life: chunks of files in, their verdicts out, until the parent hangs up.

This is what runs in each worker of :class:`memstaged.run.decider_pool.Deciders`, started by
``fork`` (or by a fork server, in the daemon) with one end of a socket pair: it closes every
descriptor it inherited but its own socket, ignores SIGINT (a terminal's ^C is the parent's)
and takes SIGTERM's default action, then decides each chunk it receives with
:func:`memstaged.core.decide.decide` and sends the verdicts back in the order received. A bug
in deciding one file is that file's :class:`Failure`, never the worker's end. It prints
nothing and runs no ``atexit``: a worker that cannot serve exits with :data:`CANNOT_SERVE`, and
the parent says, once, why it decides in process.
"""

from __future__ import annotations

import gc
import os
import pickle
import queue
import signal
import socket
import struct
import threading
import traceback
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Final

import msgspec

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

    from memstaged.core.decide import Context

#: A worker's exit status when it cannot serve (a thread or memory refused as it starts).
CANNOT_SERVE: Final = 3
#: Above any descriptor a forked worker can have inherited (memstaged raises its soft limit).
_MAX_FD: Final = 1 << 20
#: glibc's ``mallopt`` parameter: blocks of at least this size are mapped on their own...
_M_MMAP_THRESHOLD: Final = -3
#: ... of this many bytes, and so unmapped, given back, once freed.
_MAPPED_ABOVE: Final = 1 << 20


class _Heap:
    """Hands back to the system what a worker took to decide a costly chunk (one the parent
    estimated at :data:`~memstaged.run.decider_pool.RELEASE_ABOVE` or more).

    Python keeps freed objects on free lists, and glibc keeps freed memory for reuse (and
    raises its threshold for mapping a block on its own to the largest block freed): after
    deciding 8 MiB files a worker kept 99-124 MiB, after a file of 100,000 small candidates
    92-97 MiB, each worker as much, so a pool of 64 multiplied what a run took. A release is
    a full collection (which empties the free lists), then ``malloc_trim``; from the first one
    on, blocks of :data:`_MAPPED_ABOVE` or more are mapped on their own. Where there is no
    glibc, the collection alone."""

    def __init__(self) -> None:
        self._trim: Callable[[int], int] | None = None
        self._loaded = False

    def release(self) -> None:
        gc.collect()
        if not self._loaded:
            self._loaded = True
            import ctypes

            libc = ctypes.CDLL(None)
            if hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt"):
                libc.mallopt(_M_MMAP_THRESHOLD, _MAPPED_ABOVE)
                self._trim = libc.malloc_trim
        if self._trim is not None:
            self._trim(0)


class Failure(msgspec.Struct, frozen=True):
    """A worker's ``decide`` raised: what the pipeline logs for a bug (``failed``)."""

    error: str  # repr() of the exception
    traceback: str


def _start_worker() -> None:
    """In each worker: a ^C is the parent's to act on; SIGTERM ends the worker at once."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGALRM, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_DFL)


def _decide_chunk(jobs: Sequence[tuple[bytes, Context]]) -> list[bytes | Failure | None]:
    """In a worker: each job's verdict, pickled; what went wrong; or None when the verdict
    cannot be pickled (a document nested deeper than the pickler's recursion allows: deciding
    has no depth limit, pickling has). Never raises for one file."""
    from memstaged.core.decide import decide
    from memstaged.core.records import rendered_ahead

    out: list[bytes | Failure | None] = []
    for data, ctx in jobs:
        try:
            verdict = decide(data, ctx)
            # The records' bytes travel rather than the parsed file they are rendered from.
            ahead = rendered_ahead(verdict.deadletter)
            if ahead is not None and ahead:
                verdict = msgspec.structs.replace(verdict, deadletter=ahead)
        except Exception as err:  # noqa: BLE001 - a bug is logged for its file, as in process
            out.append(Failure(repr(err), traceback.format_exc()))
            continue
        try:
            out.append(pickle.dumps(verdict, pickle.HIGHEST_PROTOCOL))
        except RecursionError:
            out.append(None)  # decided again by the caller, in process
    return out


def _receive_exactly(sock: socket.socket, size: int) -> bytes:
    """``size`` bytes from ``sock``, waited for in one call where they come whole
    (``MSG_WAITALL``): the thread that receives does not wait for the interpreter's lock, held
    by the one that decides, between the pieces a socket's buffer lets through."""
    buf = bytearray(size)
    view = memoryview(buf)
    got = 0
    while got < size:
        n = sock.recv_into(view[got:], size - got, socket.MSG_WAITALL)
        if n == 0:
            raise EOFError
        got += n
    return bytes(buf)


def _receive_message(sock: socket.socket) -> bytes:
    """One message as :meth:`multiprocessing.connection.Connection.send_bytes` frames it: its
    size in 4 bytes (big-endian, signed), or -1 and then its size in 8 bytes; then the bytes."""
    (size,) = struct.unpack("!i", _receive_exactly(sock, 4))
    if size == -1:
        (size,) = struct.unpack("!Q", _receive_exactly(sock, 8))
    return _receive_exactly(sock, size)


def serve(conn: Connection, forked: bool) -> None:
    """A worker's life: decide each chunk received, send the results back, in order.

    One thread receives and another sends while the main thread decides: the parent's sends
    never wait for a worker that is itself waiting to send (the deadlock of two full pipes), and
    a worker keeps deciding while the parent is busy with a commit and reads nothing (a chunk's
    results, with their records rendered, fill a socket's buffer in two or three chunks). What
    waits to be sent is bounded by what the parent sent ahead
    (:data:`memstaged.run.decider_pool.AHEAD_FILES`). The parent
    hangs up to end the worker. A worker that cannot start its threads (a limit on processes,
    threads or memory) ends at once with :data:`CANNOT_SERVE` and prints nothing: the parent
    says, once, why it decides in process.
    """
    try:
        chunks, results, sender = _begin(conn, forked)
    except (RuntimeError, MemoryError, OSError):  # "can't start new thread", and its kin
        os._exit(CANNOT_SERVE)
    heap = _Heap()
    try:
        while (chunk := chunks.get()) is not None:
            jobs, release = pickle.loads(chunk)  # noqa: S301 - our own parent's
            del chunk
            results.put(pickle.dumps(_decide_chunk(jobs)))
            del jobs
            if release:
                heap.release()
        results.put(None)
        sender.join()
    finally:
        os._exit(0)  # the parent sees an end of file, and decides what is left in process


def _begin(
    conn: Connection, forked: bool
) -> tuple[queue.SimpleQueue[bytes | None], queue.SimpleQueue[bytes | None], threading.Thread]:
    """A worker's start: its descriptors, signals and threads; the queues of chunks received
    and results to send, and the thread that sends them.

    A forked worker first closes every descriptor it inherited but its own socket: a staging
    file's descriptor would keep its read lease (and a writer waiting) after the parent let it
    go, and another worker's socket would keep that worker from ever seeing the parent hang up.
    """
    if forked:
        keep = conn.fileno()
        os.closerange(3, keep)
        os.closerange(keep + 1, _MAX_FD)
    _start_worker()
    from memstaged.core import digests

    digests.for_backlog()  # a worker decides backlogs (one from a fork server has the built-in)
    chunks: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
    results: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()

    sock = socket.socket(fileno=os.dup(conn.fileno()))

    def receive() -> None:
        try:
            while True:
                chunks.put(_receive_message(sock))
        except (EOFError, OSError):
            chunks.put(None)

    def send() -> None:
        try:
            while (result := results.get()) is not None:
                conn.send_bytes(result)
        except OSError:
            pass  # the parent hung up (it stopped, or gave up on the pool): nothing to answer
        os._exit(0)  # no atexit, no flushing of the parent's inherited buffers

    threading.Thread(target=receive, daemon=True).start()
    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    return chunks, results, sender
