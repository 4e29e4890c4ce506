"""The temps of one transaction: every file it will install, written before it is installed.

A transaction (:mod:`memstaged.files.transaction`) changes nothing in place: each file it puts
into ``staging/`` or ``deadletter/`` is first a temp under one of memstaged's temp names
(:mod:`memstaged.files.temp_names`), written and made durable, then renamed. This module writes
those temps, keeps track of the ones not yet installed, and removes them if the transaction
stops (or leaves them, on a stop or Ctrl-C, for the next start's crash recovery). The order,
before the lock (:meth:`Temps.before_lock`):

- a too-large file that cannot be moved by a rename (``deadletter/`` on another file system) is
  copied into ``originals/`` (at most ``max_copy`` bytes), or left where it is (``UNMOVABLE``);
- each new staging file (``CREATE``) is written as a temp named as a partial write, its
  ``flock`` held, and made durable;
- with more than :data:`FSYNC_EACH` dead-letter files, every dead-letter temp (the original,
  then each record: rendered, written, dropped; only one is in memory at a time, SPEC 4) is
  written, so that a large quarantine writes nothing while the lock is held (SPEC 5: about a
  second at most);
- in a transaction of more than one decision, each rewrite's temp, named as a partial write
  (recovery deletes it) until its turn comes under the lock;
- one ``syncfs`` makes those dead-letter and rewrite temps durable.

Before these steps it looks for ``canonical-writer.lock`` (:class:`_Lookout`, a ``stat``),
and stops at the first live holder it sees, as if it had found the lock taken: SPEC 5, memstaged
does nothing in a memory dir while the reconciler holds its lock, and a large quarantine's work
before the lock takes seconds. It looks before each copy, before ``deadletter/`` is made and
before each ``syncfs``; and before every :data:`LOOK_EVERY`-th temp since it last saw no live
holder (a look per record was a third of a quarantine's system calls). So what appears once the
reconciler holds its lock is at most :data:`LOOK_EVERY` temps, whatever the machine's speed;
each is removed when the transaction stops.

Under the lock it writes the dead-letter temps of a transaction with :data:`FSYNC_EACH` of
them or fewer (each fsynced), a record again when its original takes another name, and the
rewrite's temp of a transaction of one decision (fsynced).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Final

from memstaged.core.records import DeadLetter
from memstaged.core.ticks import tick
from memstaged.errors import LockHeld
from memstaged.files import atomic_write, fsio
from memstaged.files.deadletter_names import Names, Store, Written, settle_original
from memstaged.files.locks import CANONICAL_LOCK, read_lock
from memstaged.files.plan import Action, PlanState
from memstaged.files.temp_names import PARTIAL, temp_name

#: Up to this many dead-letter temps in a transaction are fsynced one by one; more, one syncfs.
FSYNC_EACH: Final = 16
#: Temps written ahead of the lock look for it again before every this many temps since the
#: last look that found no live holder: about half a millisecond of small records. A count, not
#: a time, so that a slow or traced run writes no more under a live lock than a fast one.
LOOK_EVERY: Final = 32


def _dead_letter_files(works: Sequence[PlanState]) -> int:
    """How many dead-letter files the plans write (at most: a record per record, an original)."""
    return sum(
        len(w.plan.records) + (w.plan.original is not None) for w in works if w.unmovable is None
    )


class _Lookout:
    """Looks for ``canonical-writer.lock`` during the work before the lock (see the module).

    A look is a ``stat`` of the name (one system call, failing, when there is no lock); a lock
    there is read, and a live holder raises :class:`~memstaged.errors.LockHeld`, which ends the
    transaction as a lock found taken does: its temps removed, nothing of it done, its files
    deferred. A lock whose holder is gone is not obeyed (SPEC 5), and not read again while it
    is the same file as seen then: same inode, size, mtime and ctime (a lock taken over in
    place, or a new one that got the freed inode, differs in its ctime). Under the lock,
    memstaged's own, there is nothing to look for.
    """

    def __init__(self, mem_fd: int) -> None:
        self.mem_fd = mem_fd
        #: A lock seen stale (its holder gone), looked past while it is that same file.
        self._stale: tuple[int, int, int, int] | None = None
        #: Temps begun since a look last found no live holder (the first one looks).
        self._since = LOOK_EVERY

    def soon(self) -> None:
        """Before a temp: look, when :data:`LOOK_EVERY` temps have been begun since a look
        last found no live holder."""
        if self._since >= LOOK_EVERY:
            self()
        self._since += 1

    def __call__(self) -> None:
        self._check()
        self._since = 0

    def _check(self) -> None:
        try:
            st = os.stat(CANONICAL_LOCK, dir_fd=self.mem_fd, follow_symlinks=False)
        except OSError:
            return  # none (or it cannot be seen: taking the lock will tell)
        seen = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        if seen == self._stale:
            return
        try:
            info = read_lock(self.mem_fd)
        except OSError:
            return  # taking the lock will tell
        if info is None:
            return  # released meanwhile
        if info.alive:
            raise LockHeld(info)
        # Read after the stat: if it changed between the two, the next look reads it again.
        self._stale = seen if info.ino == st.st_ino else None


class Temps:
    """The temps of one transaction, and the ``flock`` held on new staging files' temps."""

    def __init__(self, mem_fd: int, staging_fd: int, store: Store) -> None:
        self.mem_fd = mem_fd
        self.staging_fd = staging_fd
        self.store = store
        self._look = _Lookout(mem_fd)
        #: Temp files not yet installed or handed on: removed if the transaction stops.
        self.ours: set[tuple[int, str]] = set()
        #: The descriptors holding the ``flock`` of new staging files' temps (see
        #: :meth:`_write_ahead`), closed once each temp is renamed or removed.
        self.held: dict[tuple[int, str], int] = {}
        #: Whether the dead-letter temps are written (before the lock, or under it).
        self.written_ahead = False
        #: A rewrite's temp, kept open (readable) by its plan's key: the bytes put in place are
        #: read through it again once they are (:func:`staging_swap.replace`'s look).
        self.kept: dict[str, int] = {}

    def close(self, *, interrupted: bool = False) -> None:
        """Remove the temps not installed (unless ``interrupted``), and release their locks.

        ``interrupted`` (a stop's :class:`~memstaged.errors.Abandoned`, Ctrl-C): the temps are
        left, exactly as a kill would leave them, for the next start's crash recovery to
        remove: a quarantine of 100,000 records has as many temps, and unlinking them would
        keep a SIGTERM waiting for seconds (SPEC 6: acted on within a second). They carry
        memstaged's temp names, which the reconciler never reads.
        """
        if not interrupted:
            for dir_fd, tmp in self.ours:
                fsio.unlink_quietly(dir_fd, tmp)
        self.ours.clear()
        for fd in self.held.values():  # after the unlinks: a temp is never named and unlocked
            os.close(fd)
        self.held.clear()
        self.close_kept()

    def close_kept(self, key: str | None = None) -> None:
        """Close the kept descriptor of the rewrite of ``key`` (of every rewrite: None)."""
        for k in [key] if key is not None else list(self.kept):
            fd = self.kept.pop(k, None)
            if fd is not None:
                os.close(fd)

    def installed(self, dir_fd: int, tmp: str) -> None:
        """``tmp`` got its name (or was handed on): it is no longer ours to remove."""
        self.ours.discard((dir_fd, tmp))

    def created(self, tmp: str) -> None:
        """A new staging file's temp got its name: no longer ours, its ``flock`` released."""
        self.ours.discard((self.staging_fd, tmp))
        lock_fd = self.held.pop((self.staging_fd, tmp), None)
        if lock_fd is not None:
            os.close(lock_fd)  # renamed: no temp of that name is left to guard

    # -- before the lock ------------------------------------------------------------------------

    def before_lock(
        self,
        decisions: Sequence[PlanState],
        changes: Sequence[PlanState],
        max_copy: int,
        *,
        keep: bool = False,
    ) -> None:
        """Copies where a rename is impossible, new staging files, many dead-letter temps and
        a batch's rewrite temps (kept open with ``keep``), the last two made durable by one
        ``syncfs``; each step only while no live process holds ``canonical-writer.lock``."""
        for work in decisions:
            if work.plan.action is Action.MOVE:
                self._look()
                self._copy_if_unmovable(work, max_copy)
        self._write_ahead(changes)
        dead_letter = _dead_letter_files(decisions) > FSYNC_EACH
        if dead_letter:
            self.write_dead_letter(decisions, ahead=True)
        rewrites = 0
        if len(decisions) > 1:  # one decision (the daemon's) writes its rewrite under the lock
            for work in decisions:
                if work.plan.action is Action.REWRITE:
                    self._look.soon()
                    work.rewrite_tmp = self.rewrite(work, batch=True, keep=keep)
                    rewrites += 1
        if dead_letter or rewrites:
            self._look()
            self._sync(self.mem_fd, self.staging_fd, *(self.store.fds or ()))
            fsio.crash_point("temps-synced")

    @staticmethod
    def _sync(*fds: int) -> None:
        """``syncfs`` once for each file system among ``fds``' (``staging/`` or ``deadletter/``
        may be a mount of its own): every temp written there is durable from here on."""
        synced: set[int] = set()
        for fd in fds:
            dev = os.fstat(fd).st_dev
            if dev not in synced:
                synced.add(dev)
                fsio.syncfs(fd)

    def _copy_if_unmovable(self, work: PlanState, max_copy: int) -> None:
        """SPEC 6: where a rename is impossible, copy at most ``max_copy`` bytes, or leave it."""
        version = work.plan.version
        assert version is not None
        or_fd = self.store.open()[1]
        if os.fstat(or_fd).st_dev == version.identity.dev:
            return  # one file system: moved by a rename
        size = version.identity.size
        if size > max_copy:
            work.unmovable = f"larger than max_quarantine_copy ({max_copy} bytes)"
            return
        tmp, _sha, _size = atomic_write.copy_to_temp(version.fd, or_fd, "orig", work.key, most=size)
        self.ours.add((or_fd, tmp))
        fsio.crash_point("copy-written")
        work.copied = tmp

    def _write_ahead(self, changes: Sequence[PlanState]) -> None:
        """Write the new staging files of ``CREATE`` plans as durable temps, before the lock.

        Each temp is named as a partial write until it gets its name under the lock: a
        memstaged starting after a crash deletes it (the records it holds are all still in the
        store) instead of keeping it as a staging file, which would stage its candidates twice.
        This process holds each temp's ``flock`` until then, so that a daemon starting while it
        runs (its crash recovery) leaves the temp alone: it is no leftover of a crash.
        """
        creates = [w for w in changes if w.plan.action is Action.CREATE]
        batch = len(creates) > 1
        for work in creates:
            assert work.plan.data is not None
            self._look.soon()
            try:
                work.tmp, lock_fd = atomic_write.write_held_temp(
                    self.staging_fd,
                    work.plan.data,
                    PARTIAL,
                    f"{work.plan.base}.recovered.json",
                    sync=not batch,
                )
            except OSError as err:
                work.failed = f"could not write the staging file: {err.strerror or err}"
                continue
            self.ours.add((self.staging_fd, work.tmp))
            self.held[(self.staging_fd, work.tmp)] = lock_fd
        if batch and any(w.tmp is not None for w in creates):
            self._look()
            self._sync(self.mem_fd, self.staging_fd)  # every new staging file's data

    # -- the dead-letter temps, before the lock or under it -------------------------------------

    def write_dead_letter(self, works: Sequence[PlanState], *, ahead: bool) -> None:
        """Write every dead-letter temp of ``works``: ``ahead`` of the lock, looking for it
        before each, made durable by the caller's one ``syncfs``; else under it, each fsynced.

        Streaming: a record is rendered, written and dropped, so a file of 100,000 candidates
        never has their records in memory together (SPEC 4). With more than
        :data:`FSYNC_EACH` files this runs before the lock (one ``syncfs``), so that the lock
        is held only for names, renames and fsyncs of directories (SPEC 5: about a second at
        most); the temps carry memstaged's temp names: the reconciler never reads them, and
        recovery after a crash deletes them. A few files are written under the lock, each
        fsynced (as cheap as that, and nothing at all appears while the reconciler works).
        """
        todo = [w for w in works if w.unmovable is None and (w.plan.records or w.plan.original)]
        self.written_ahead = True
        if not todo:
            return
        if ahead:
            self._look()  # before deadletter/ is made, too
        dl_fd, or_fd = self.store.open()
        names = Names()  # a first choice of each original's name: looked at, not listed
        for work in todo:
            plan = work.plan
            if plan.original is not None:
                renamed = plan.action is Action.MOVE
                data = plan.version.data if plan.version is not None else None
                # A first choice, checked again under the lock: the records are rendered for it.
                work.original, _file = settle_original(
                    or_fd, plan.original, names, data=data, tmp=None, renamed=renamed
                )
                if not renamed:
                    assert data is not None
                    if ahead:
                        self._look.soon()
                    work.original_tmp = atomic_write.write_temp(
                        or_fd,
                        data,
                        "rec",
                        work.original,
                        sync=not ahead,
                        deleted_whole_or_partial=True,
                    )
                    self.ours.add((or_fd, work.original_tmp))
            work.written = self._write_records(work, dl_fd, ahead=ahead)
        if not ahead:
            fsio.crash_point("temps-synced")  # ahead: once synced, by the caller

    def _write_records(self, work: PlanState, dl_fd: int, *, ahead: bool) -> list[Written]:
        """Each record's temp, rendered one at a time (its bytes are dropped once written);
        ``ahead`` of the lock, each only while no live process holds it, and not fsynced."""
        written: list[Written] = []
        for record in work.plan.records:
            tick()  # each record is rendered and written: thousands of them take seconds
            if ahead:
                self._look.soon()
            body = _render(record, work.original)
            tmp = atomic_write.write_temp(
                dl_fd, body, "rec", record.name, sync=not ahead, deleted_whole_or_partial=True
            )
            self.ours.add((dl_fd, tmp))
            written.append(Written(tmp, len(body)))
            del body
        return written

    def rerender(self, work: PlanState) -> None:
        """Under the lock, rare: the records point at the original's new name; written again."""
        dl_fd = self.store.open()[0]
        for old in work.written:
            fsio.unlink_quietly(dl_fd, old.tmp)
            self.ours.discard((dl_fd, old.tmp))
        work.written = self._write_records(work, dl_fd, ahead=False)

    # -- the rewrites: a batch's before the lock, one decision's under it ----------------------

    def rewrite(self, work: PlanState, batch: bool, *, keep: bool = False) -> str:
        """A rewrite's temp in ``staging/``: fsynced, or in a ``batch`` synced later at once
        (before the lock, with the dead-letter temps); with ``keep``, its descriptor kept open
        in :attr:`kept`."""
        assert work.plan.data is not None
        kept: list[int] | None = [] if keep else None
        # Named ``part`` until it is durable: recovery deletes ``part`` temps rather than
        # keeping them as versions.
        role = PARTIAL if batch else "new"
        tmp = atomic_write.write_temp(
            self.staging_fd,
            work.plan.data,
            role,
            work.key,
            sync=not batch,
            deleted_whole_or_partial=batch,
            keep=kept,
        )
        if kept:
            self.kept[work.key] = kept[0]
        self.ours.add((self.staging_fd, tmp))
        fsio.crash_point("temp-written")
        return tmp

    def ready(self, tmp: str, name: str, batch: bool) -> str:
        """The durable rewrite under a ``new`` name, handed to :func:`staging_swap.replace`."""
        self.ours.discard((self.staging_fd, tmp))
        if not batch:
            return tmp
        ready = temp_name("new", name)
        try:  # never over a file at that name: temp names can be guessed
            fsio.rename_noreplace(self.staging_fd, tmp, self.staging_fd, ready)
        except BaseException:
            self.ours.add((self.staging_fd, tmp))
            raise
        return ready


def _render(record: DeadLetter, original: str | None) -> bytes:
    """A record's bytes, naming the original's settled name (its planned one if it has none)."""
    return record.render(original if original is not None else record.original)
