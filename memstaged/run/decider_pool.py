"""Deciding on every core: a pool of processes that run :func:`memstaged.core.decide.decide`.

Deciding is pure (``bytes, Context -> Verdict``: no disk, no clock, no state kept between two
files), so it can run in other processes while the one that owns the transaction reads the next
files and carries decisions out. :class:`Deciders` is that pool; :meth:`Deciders.ahead`
walks a sequence of files read by the caller, sends their bytes to the workers in small chunks,
keeps reading while they decide, and hands each file back *in the order it was read* with its
verdict, so that what is logged and applied, and in what order, is what deciding in process gives.

What stays in the calling process:

- a batch of fewer than :data:`POOL_THRESHOLD` files (the daemon's one file, a ``--once`` of a
  few files): starting workers would cost more than it saves (docs/performance.md measures what
  a worker costs to start);
- a file too large to read (nothing to decide but its identity);
- every file once the pool is given up (a worker killed or stopped, a fork or a thread refused):
  deciding again in process gives the same verdict, since deciding is pure, so a pool given up
  costs time and nothing else. It is given up for the rest of the run, said once
  (``on_break``).

No wait on a worker is unbounded: a chunk's verdicts are waited for at most
:func:`answer_seconds` (ten seconds and twenty per MiB sent, rounded up to a step of ratio
√2: twenty times what the slowest file measured takes on an idle core, at least), a send that makes
no progress at most :data:`STALL_SECONDS`; a worker that does not answer in time is killed. A
signal (SIGTERM, Ctrl-C) interrupts every such wait. :meth:`Deciders.close` kills and reaps
every worker, at once: a worker holds nothing but files to decide, which the caller decides
again if it needs.

What the files sent ahead may cost in memory, together with those the caller holds, stays
within a :class:`memstaged.run.memory_budget.Ledger`: the pool does not multiply the memory of a
run.

The pool is started on first use and stopped by :meth:`Deciders.close`; its workers ignore
SIGINT (a terminal's ^C is the parent's to handle) and take SIGTERM's default action, so a
service manager that signals the whole group ends them at once. What a worker does, in its own
process, is :mod:`memstaged.run.decider_worker`'s.
"""

from __future__ import annotations

import math
import os
import pickle
import resource
import signal
import struct
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Final, Generic, TypeVar

from memstaged.errors import ConfigError
from memstaged.run.decider_worker import CANNOT_SERVE, Failure, serve
from memstaged.run.memory_budget import Ledger, estimate

if TYPE_CHECKING:  # multiprocessing is imported when a pool starts: start-up stays lean
    import multiprocessing.context
    import multiprocessing.process
    from multiprocessing.connection import Connection

    from memstaged.core.decide import Context, Verdict

__all__ = [
    "AHEAD_BYTES",
    "AHEAD_FILES",
    "CHUNK",
    "CHUNK_LEAST",
    "POOL_THRESHOLD",
    "RELEASE_ABOVE",
    "STALL_SECONDS",
    "WORKERS_ENV",
    "Deciders",
    "Failure",
    "ReadAhead",
    "answer_seconds",
    "workers_wanted",
]

#: Batches of fewer files are decided in the process that reads them. Starting two workers by
#: ``fork`` and getting their first verdicts back took 13-50 ms on a busy 2-core machine
#: (measure 18; up to 140 ms at a load of 10), and a file takes 100-400 µs to decide: below a
#: few hundred files the workers would not win back their own start.
POOL_THRESHOLD: Final = 256
#: Files sent to a worker at a time, at most: enough to make the hand-over (a pickle and a
#: socket write each way, and the worker's thread hand-offs) small beside the deciding. Measure
#: 9's 3,000 files took 1.5 system calls per file in hand-overs in chunks of 16, 0.4 in chunks
#: of 64.
CHUNK: Final = 64
#: A chunk estimated to cost this much or more (:func:`memstaged.run.memory_budget.estimate`)
#: is followed, in its worker, by a release of what deciding it took (a collection, then
#: ``malloc_trim``): between chunks each worker keeps at most about this much of it, whatever
#: the number of workers. A chunk of 64 ordinary files is estimated at 7-11 MiB, and is not.
RELEASE_ABOVE: Final = 32 << 20
#: Files sent to a worker at a time, at least: with many workers, chunks are made smaller (down
#: to this) so that :data:`AHEAD_FILES` still gives every worker two chunks (see
#: :meth:`Deciders.chunk`).
CHUNK_LEAST: Final = 16
#: The bytes read ahead and not yet handed back, at most (beyond the first chunk in flight):
#: what read-ahead adds to the process's memory, whatever the size of the files.
AHEAD_BYTES: Final = 16 * 1024 * 1024
#: The files read and sent ahead before a transaction's commit, at most: the workers decide the
#: next transaction's files while the commit runs (a few hundred milliseconds), and each file read
#: ahead holds a descriptor and its read lease until it is decided (SPEC 6: bounded).
AHEAD_FILES: Final = 512
#: Descriptors left free beside those open when a memory dir's run starts (inherited ones
#: included), the files read ahead and the versions a transaction holds: what a commit opens
#: (temps, directories, ``canonical-writer.lock``) and a module imported late (``ctypes``, at
#: the first commit: an EMFILE there was a traceback).
FD_RESERVE: Final = 64
#: The descriptors a started worker holds in this process: its socket, and the two pipes a
#: fork leaves (a fork server's: a pipe and the sentinel).
WORKER_FDS: Final = 3
#: The environment variable that sets how many workers decide (0: none, decide in process).
WORKERS_ENV: Final = "MEMSTAGED_WORKERS"
#: The most workers taken from :data:`WORKERS_ENV`: a typo of ``10000`` would fork that many.
MAX_WORKERS: Final = 64

#: A chunk's verdicts are waited for at most this long, plus :data:`ANSWER_SECONDS_PER_MIB`
#: per MiB of its files: the slowest file measured (an object nested a million deep, 8 MiB)
#: took 0.9 s per MiB on an idle core, a chunk of small files milliseconds. A worker that does
#: not answer in time (stopped, swapping, looping) is killed.
ANSWER_SECONDS: Final = 10.0
ANSWER_SECONDS_PER_MIB: Final = 20.0
#: The send buffer asked for on each worker's socket: two chunks of files of a few KiB each, so
#: that the main process hands a chunk over and goes on (to its commit) while the worker is
#: busy deciding the one before. A buffer of the default size (208 KiB) holds less than one
#: chunk, and each hand-over waited for the worker's receiving thread (1-8 ms, 40-110 ms per
#: 3,000 files). The kernel grants at most ``net.core.wmem_max``; memory stays bounded by
#: :data:`AHEAD_BYTES` whatever it grants.
SEND_BUFFER: Final = 2 << 20
#: A send to a worker that makes no progress for this long (the worker stopped reading) gives
#: the pool up.
STALL_SECONDS: Final = 10.0

T = TypeVar("T")


def workers_wanted(env: dict[str, str] | None = None) -> int:
    """How many worker processes decide: :data:`WORKERS_ENV`, else the CPUs this process may use.

    One CPU means no pool at all: a worker would only take turns with the reader on that CPU.
    """
    text = (os.environ if env is None else env).get(WORKERS_ENV, "").strip()
    if not text:
        cores = len(os.sched_getaffinity(0))
        return cores if cores > 1 else 0
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= MAX_WORKERS:
        raise ConfigError(
            f"{WORKERS_ENV}={text!r}: expected a number of worker processes from 0 to "
            f"{MAX_WORKERS} (0: decide in the reading process)"
        )
    return value


def answer_seconds(nbytes: int) -> int:
    """How long the verdicts of a chunk of ``nbytes`` of files are waited for: rounded up to a
    step of a grid of ratio √2 (12, 16, 23, 32, 46, 64 s, …), so that chunks of like sizes
    share one bound, set on the socket once (at most 1.42 times the wait, for a worker that is
    stuck; a power of two doubled it, and with a send buffer that takes chunks in whole, it is
    what a stopped worker costs)."""
    wanted = ANSWER_SECONDS + ANSWER_SECONDS_PER_MIB * nbytes / (1 << 20)
    return math.ceil(2 ** (math.ceil(2 * math.log2(wanted)) / 2))


def _set_timeout(
    conn: Connection, seconds: float, *, reads: bool, send_buffer: int | None = None
) -> None:
    """Bound each blocking read (``SO_RCVTIMEO``) or write (``SO_SNDTIMEO``) on a worker's
    socket: past ``seconds`` without progress, it fails with ``EAGAIN``. ``send_buffer``: ask
    for a send buffer that large too (``SO_SNDBUF``; the kernel grants at most
    ``net.core.wmem_max``)."""
    import socket

    sock = socket.socket(fileno=conn.fileno())
    try:
        whole = int(seconds)
        timeval = struct.pack("ll", whole, int((seconds - whole) * 1_000_000))
        option = socket.SO_RCVTIMEO if reads else socket.SO_SNDTIMEO
        sock.setsockopt(socket.SOL_SOCKET, option, timeval)
        if send_buffer is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer)
    finally:
        sock.detach()  # the descriptor stays the connection's


class Deciders:
    """A pool of decider processes, started on first use; :meth:`close` stops it.

    Each worker has its own socket pair: chunks go round-robin and their results are read back
    in the order sent, so a worker that dies is an end of file on its own socket (no shared
    queue a killed worker could leave locked or half-written) and no thread runs in this
    process to feed or drain the workers. ``on_break`` is told, once, why the pool was given up.
    """

    def __init__(self, workers: int, on_break: Callable[[str], None] | None = None) -> None:
        self.workers = workers
        #: Files sent to a worker at a time: :data:`CHUNK`, or fewer where that would leave a
        #: worker without two chunks of :data:`AHEAD_FILES` (16 or more workers).
        self.chunk = max(CHUNK_LEAST, min(CHUNK, AHEAD_FILES // (2 * max(1, workers))))
        self._conns: list[Connection] = []
        #: The read bound (``SO_RCVTIMEO``, seconds) set on each worker's socket so far.
        self._bounds: list[int] = []
        self._procs: list[multiprocessing.process.BaseProcess] = []
        self._next = 0
        self._on_break = on_break
        #: Why the pool stopped being used, once it was given up (None while it works).
        self.broken: str | None = None

    def ahead(
        self,
        items: Iterable[T],
        job: Callable[[T], tuple[bytes, Context] | None],
        size: int,
        held: int = 0,
        budget: int | None = None,
    ) -> ReadAhead[T]:
        """Walk ``items`` (each a file read), deciding ahead in the pool when ``size`` (the
        batch's number of files) is worth it; ``job`` gives an item's bytes and context, or
        None for an item with nothing to decide (skipped, unreadable, too large). ``held``:
        the descriptors the caller holds or may hold besides (those open already, a
        transaction's versions): what is read
        ahead stays within the descriptor limit beside them (:meth:`ahead_files`). ``budget``:
        what the files in flight and in the caller's hands may cost together
        (:mod:`memstaged.run.memory_budget`; None: no bound)."""
        ledger = Ledger(budget)
        if self.workers == 0 or size < POOL_THRESHOLD or self.broken is not None:
            return ReadAhead(None, items, job, ledger=ledger)  # the daemon's one file
        most = self.ahead_files(held)
        return ReadAhead(self if most > 0 else None, items, job, most, ledger)

    def ahead_files(self, held: int) -> int:
        """How many files may be read ahead (each holds a descriptor until it is decided): up
        to :data:`AHEAD_FILES`, and never more than the soft ``RLIMIT_NOFILE`` leaves beside
        ``held`` (the caller's, the pool's included) and :data:`FD_RESERVE`; whole chunks, one
        of them for verdicts back and not yet taken.

        SPEC 6: a service manager's soft limit is 1,024, and a hard limit can be lower still;
        512 files read ahead and 256 held by a transaction, or 2 chunks per worker on a machine
        of 32 cores, ran out of descriptors in the commit. 0: too few to read ahead
        (the files are then decided in process, one after the other, as before the pool).
        """
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if soft == resource.RLIM_INFINITY:
            return AHEAD_FILES
        room = soft - held - FD_RESERVE
        chunks = room // self.chunk - 1
        return max(0, min(AHEAD_FILES, chunks * self.chunk))

    def descriptors_to_come(self) -> int:
        """The descriptors the pool will open when it starts (:data:`WORKER_FDS` a worker); 0
        once it has started (they are open, and counted with the process's) or given up."""
        if self._procs or self.broken is not None:
            return 0
        return WORKER_FDS * self.workers

    def _submit(self, jobs: list[tuple[bytes, Context]], release: bool = False) -> int | None:
        """Send a chunk to the next worker; which one (None: the pool is given up).
        ``release``: the worker gives back what deciding it took, once it is decided."""
        if self.broken is not None:
            return None
        try:
            if not self._conns:
                self._start()
        except (OSError, ValueError) as err:  # ValueError: a fork or a socket refused
            self._give_up(f"a decider could not be started: {err}")
            return None
        worker = self._next
        self._next = (worker + 1) % self.workers
        try:
            self._conns[worker].send_bytes(pickle.dumps((jobs, release), pickle.HIGHEST_PROTOCOL))
        except BlockingIOError:  # SO_SNDTIMEO: the worker read nothing for that long
            self._give_up(f"a decider took no work for {STALL_SECONDS:g} s, and was killed")
            return None
        except OSError as err:
            self._lost(worker, err)
            return None
        return worker

    def _start(self) -> None:
        import multiprocessing

        # fork is the cheapest start (nothing imported again) and safe in a process with one
        # thread (--once); a daemon has its watcher thread, whose locks a fork could copy held,
        # so its workers come from a fork server started without threads.
        forked = threading.active_count() == 1
        context: multiprocessing.context.ForkContext | multiprocessing.context.ForkServerContext
        if forked:
            context = multiprocessing.get_context("fork")
        else:
            context = multiprocessing.get_context("forkserver")
            context.set_forkserver_preload(["memstaged.core.decide"])
        for _ in range(self.workers):
            ours, theirs = context.Pipe(duplex=True)
            self._conns.append(ours)
            self._bounds.append(0)
            try:
                proc = context.Process(target=serve, args=(theirs, forked), daemon=True)
                proc.start()
            finally:
                theirs.close()  # so that the worker's death is an end of file here
            self._procs.append(proc)
            _set_timeout(ours, STALL_SECONDS, reads=False, send_buffer=SEND_BUFFER)

    def _result(self, worker: int | None, nbytes: int) -> list[bytes | Failure | None] | None:
        """The verdicts of the chunk of ``nbytes`` sent to ``worker``, waited for at most
        :func:`answer_seconds`; None: decide them in process (the pool is given up)."""
        if worker is None or self.broken is not None:
            return None
        seconds = answer_seconds(nbytes)
        try:
            conn = self._conns[worker]
            if self._bounds[worker] != seconds:
                _set_timeout(conn, seconds, reads=True)
                self._bounds[worker] = seconds
            data = conn.recv_bytes()
        except BlockingIOError:  # SO_RCVTIMEO: nothing came for that long
            self._give_up(f"a decider did not answer within {seconds:.0f} s, and was killed")
            return None
        except (EOFError, OSError) as err:
            self._lost(worker, err)
            return None
        got: list[bytes | Failure | None] = pickle.loads(data)  # noqa: S301 - our own worker's
        return got

    def _lost(self, worker: int, err: BaseException) -> None:
        """A worker's socket failed (it ended): give the pool up, saying why it ended."""
        proc = self._procs[worker]
        self.close()
        if proc.exitcode == CANNOT_SERVE:
            why = "a decider could not start its threads (a limit on processes, threads or memory)"
        else:
            why = f"a decider ended unexpectedly (exit status {proc.exitcode}; {err!r})"
        self._give_up(why)

    def _give_up(self, why: str) -> None:
        """Kill the workers and decide in process for the rest of the run; said once."""
        self.close()
        self.broken = f"the pool of deciders broke: {why}; deciding in this process from now on"
        if self._on_break is not None:
            self._on_break(self.broken)

    def close(self) -> None:
        """Hang up on the workers, kill them and reap them, at once, whatever state each is in
        (busy, stopped, exiting): a worker holds only files to decide, which the caller decides
        again if it still needs them. A worker's end can no longer be told from its sentinel
        (it closed every inherited descriptor), so nothing here waits for it to end by itself;
        SIGTERM and Ctrl-C wait until every worker is reaped, microseconds after its SIGKILL."""
        conns, self._conns = self._conns, []
        self._bounds = []
        procs, self._procs = self._procs, []
        if not conns and not procs:
            return
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        try:
            for conn in conns:
                conn.close()
            for proc in procs:
                if proc.exitcode is None:  # reaps one that ended: no other process is signalled
                    proc.kill()
            for proc in procs:
                proc.join()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)


class _Chunk(Generic[T]):
    """Items read ahead together: the indexes among them that were sent, to which worker, and
    what each costs (:func:`memstaged.run.memory_budget.estimate`)."""

    __slots__ = ("costs", "items", "nbytes", "sent", "worker")

    def __init__(
        self, items: list[T], costs: list[int], sent: list[int], worker: int | None, nbytes: int
    ) -> None:
        self.items = items
        self.costs = costs
        self.sent = sent
        self.worker = worker
        self.nbytes = nbytes


class ReadAhead(Generic[T]):
    """Items in their order, each with its verdict from the pool (None: decide it in process).

    Taking the next item pulls items from the source while the workers decide, up to
    ``2 x workers`` chunks or :data:`AHEAD_BYTES` ahead of what it hands back, and never more
    than ``most`` items in flight (each holds a descriptor). A caller may stop
    taking items at any point (a transaction is full) and take the rest later (the next
    transaction): nothing read is dropped. :meth:`prefetch` reads and sends further ahead, up to
    ``most`` (:data:`AHEAD_FILES` at most), so that the workers decide the next transaction's
    files while the caller carries out this one's; :meth:`close` hands back the items never
    taken, for the caller to release what they hold.

    Memory: each item is charged to ``ledger`` (this reader's own) with its estimated cost from
    the moment it is read until the caller is :meth:`done` with it: in a worker, waiting to be
    handed out, or in the caller's hands (deciding it again, holding its plan until its
    transaction is carried out). An item the ledger does not admit waits: it is not sent
    ahead, and, while the caller holds others, not handed out either: the iteration stops
    there for now, the caller carries out what it holds, is done with it, and takes the rest.
    """

    def __init__(
        self,
        deciders: Deciders | None,
        items: Iterable[T],
        job: Callable[[T], tuple[bytes, Context] | None],
        most: int = AHEAD_FILES,
        ledger: Ledger | None = None,
    ) -> None:
        self._deciders = deciders
        #: The most chunks in flight: ``most`` files read ahead (:meth:`Deciders.ahead_files`).
        self._chunk = deciders.chunk if deciders is not None else CHUNK
        self._depth = max(1, most // self._chunk)
        self._items = iter(items)
        self._job = job
        self._ledger = ledger if ledger is not None else Ledger(None)
        self._exhausted = False
        #: An item read that the ledger did not admit yet, with its job and cost.
        self._waiting: tuple[T, tuple[bytes, Context] | None, int] | None = None
        #: Chunks sent (or kept whole in process: nothing in them to decide), oldest first.
        self._chunks: deque[_Chunk[T]] = deque()
        #: Items whose verdicts are back, to hand out before any other, with their costs.
        self._ready: deque[tuple[T, Verdict | Failure | None, int]] = deque()
        #: The costs of the items handed out that the caller is not done with, by ``id``.
        self._handed: dict[int, int] = {}
        #: The chunk being filled: its items, their costs, the indexes sent, their jobs.
        self._filling: list[T] = []
        self._costs: list[int] = []
        self._sent: list[int] = []
        self._jobs: list[tuple[bytes, Context]] = []
        self._held = 0  # the bytes of the jobs in flight

    def __iter__(self) -> Iterator[tuple[T, Verdict | Failure | None]]:
        return self

    def __next__(self) -> tuple[T, Verdict | Failure | None]:
        deciders = self._deciders
        if deciders is None:
            got = self._pull()
            if got is None:
                raise StopIteration
            item, _work, cost = got
            self._ledger.take(cost)
            self._hand(item, cost)
            return item, None
        while not self._ready:
            self._fill(min(2 * deciders.workers, self._depth))
            if not self._chunks:
                raise StopIteration
            self._receive(deciders)
        item, verdict, cost = self._ready.popleft()
        self._hand(item, cost)
        return item, verdict

    def done(self, item: T) -> None:
        """The caller holds nothing more of ``item`` (decided and logged, or carried out)."""
        self._ledger.give(self._handed.pop(id(item), 0))

    def prefetch(self) -> None:
        """Read and send up to ``most`` items ahead (:data:`AHEAD_FILES`): the caller is about
        to be busy (a commit) and the workers would otherwise wait for it."""
        if self._deciders is not None:
            self._fill(self._depth)

    def close(self) -> list[T]:
        """The items pulled from the source and never handed out.

        With verdicts still in flight (the caller left early: an error, a stop, Ctrl-C) the pool
        is hung up on, not drained: its next user starts another and reads only its own verdicts,
        and nothing here waits on a worker's socket that an interrupted read may have left out
        of step.
        """
        left = [item for item, _, _ in self._ready]
        self._ready.clear()
        if self._chunks and self._deciders is not None:
            self._deciders.close()
        while self._chunks:
            left += self._chunks.popleft().items
        left += self._filling
        if self._waiting is not None:
            left.append(self._waiting[0])
        self._filling, self._costs, self._sent, self._jobs = [], [], [], []
        self._waiting = None
        self._exhausted = True
        self._handed.clear()
        self._ledger.give(self._ledger.used)
        return left

    def _pull(self) -> tuple[T, tuple[bytes, Context] | None, int] | None:
        """The next item read, with its job and cost, once the ledger admits it; None when the
        source is exhausted or the next item must wait (it is kept for a later call)."""
        got = self._waiting
        self._waiting = None
        if got is None:
            if self._exhausted:
                return None
            try:
                item = next(self._items)
            except StopIteration:
                self._exhausted = True
                return None
            work = self._job(item)
            unbounded = self._ledger.limit is None  # nothing to weigh it against
            got = (item, work, 0 if work is None or unbounded else estimate(work[0]))
        if not self._ledger.admits(got[2]):
            self._waiting = got
            return None
        return got

    def _hand(self, item: T, cost: int) -> None:
        if cost:
            self._handed[id(item)] = self._handed.get(id(item), 0) + cost

    def _fill(self, depth: int) -> None:
        """Pull and send items until ``depth`` chunks or :data:`AHEAD_BYTES` are in flight, or
        the next item waits for the ledger."""
        while len(self._chunks) < depth and self._held < AHEAD_BYTES:
            got = self._pull()
            if got is None:
                break
            item, work, cost = got
            self._ledger.take(cost)
            self._filling.append(item)
            self._costs.append(cost)
            if work is not None:
                self._sent.append(len(self._filling) - 1)
                self._jobs.append(work)
                self._held += len(work[0])
            if len(self._filling) >= self._chunk:
                self._flush()
        self._flush()

    def _flush(self) -> None:
        if not self._filling:
            return
        assert self._deciders is not None
        jobs = self._jobs
        cost = sum(self._costs[i] for i in self._sent)
        worker = self._deciders._submit(jobs, cost >= RELEASE_ABOVE) if jobs else None
        nbytes = sum(len(data) for data, _ in jobs)
        self._chunks.append(_Chunk(self._filling, self._costs, self._sent, worker, nbytes))
        self._filling, self._costs, self._sent, self._jobs = [], [], [], []

    def _receive(self, deciders: Deciders) -> None:
        chunk = self._chunks.popleft()
        self._held -= chunk.nbytes
        verdicts = deciders._result(chunk.worker, chunk.nbytes)
        by_index: dict[int, bytes | Failure | None] = (
            {} if verdicts is None else dict(zip(chunk.sent, verdicts, strict=True))
        )
        for i, (item, cost) in enumerate(zip(chunk.items, chunk.costs, strict=True)):
            got = by_index.get(i)
            # The unpickler needs no recursion, whatever the nesting (C's _pickle).
            verdict = pickle.loads(got) if isinstance(got, bytes) else got  # noqa: S301
            self._ready.append((item, verdict, cost))
