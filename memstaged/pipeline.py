"""The file layer: read one staging file safely, decide it, carry the decision out, log it.

The daemon and ``--once`` both call :meth:`Pipeline.process`; it is the only code that changes
``staging/`` or ``deadletter/``. The order of every write follows SPEC section 5: what takes a
file's place is durable before the file is replaced or removed, and a version a writer renamed in
while memstaged worked is handed back by ``renameat2(RENAME_EXCHANGE)`` and kept, never overwritten.
"""

from __future__ import annotations

import errno
import itertools
import os
import stat
import time
import traceback
from collections.abc import Callable, Iterator
from enum import Enum
from typing import Any, Final

import msgspec

from memstaged import fsio
from memstaged.fsio import Identity
from memstaged.locks import LockHeld, LockInfo, canonical_lock, read_lock, remove_stale_own_lock
from memstaged.quarantine import ORIGINALS_DIR, original_name, stem
from memstaged.timestamps import format_epoch_ms
from memstaged.triage import Context, Decision, Verdict, decide, decide_too_large

STAGING: Final = "staging"
DEADLETTER: Final = "deadletter"


class MemoryDir(msgspec.Struct, frozen=True):
    """A memory dir and the project root its files must name (SPEC 2.4)."""

    path: str
    project_root: str

    @property
    def staging(self) -> str:
        return os.path.join(self.path, STAGING)


class Options(msgspec.Struct, frozen=True):
    """The settings that change how a file is decided or applied."""

    settle: float = 2.0
    max_file_size: int = 8 * 1024 * 1024
    split_invalid_candidates: bool = False
    dry_run: bool = False


class Outcome(msgspec.Struct, frozen=True):
    """What happened to one file: the decision, the version it was about, when to look again."""

    decision: Decision
    identity: Identity | None = None
    #: For ``deferred``: the earliest wall-clock time worth looking again (None: on the next event).
    retry_at: float | None = None
    #: The file changed while it was being decided: decide it again now.
    changed: bool = False
    #: Deferred because a live process holds ``canonical-writer.lock``: retry when it goes.
    blocked_by_lock: bool = False


class _Pending(msgspec.Struct):
    """A decision of a batch waiting to be carried out with the others (see process_batch)."""

    name: str
    identity: Identity
    verdict: Verdict
    data: bytes
    event: dict[str, Any]
    started: float
    #: Dead-letter temp files written for it: (directory fd, temp name, final name).
    installs: list[tuple[int, str, str]] = []
    tmp: str | None = None


class Batch:
    """Files decided together by :meth:`Pipeline.decide_batch`, applied by ``apply_batch``.

    True while it has files.
    """

    def __init__(self, mdir: MemoryDir) -> None:
        self.mdir = mdir
        #: Every file's outcome; a pending one is :data:`_PENDING` until the batch is applied.
        self.outcomes: dict[str, Outcome] = {}
        self.pending: list[_Pending] = []

    def __bool__(self) -> bool:
        return bool(self.outcomes)


#: What :meth:`Pipeline.process` returns for a file whose decision waits for its batch.
_PENDING: Final = Outcome(Decision.DEFERRED)
#: How many files a batch decides and carries out together: one syncfs and one fsync per
#: directory each. Measured on a 10,000-file backlog (docs/performance.md): 256 → 1,024 takes a
#: fifth off the time spent applying; beyond, the gain is small and the batch's memory grows.
BATCH: Final = 1024
#: ... and at most this many bytes of pending rewrites and originals held in memory at once.
BATCH_BYTES: Final = 32 * 1024 * 1024


class _Applied(Enum):
    DONE = "done"
    CONFLICT = "conflict"
    GONE = "gone"
    CHANGED = "changed"


def is_staging_name(name: str) -> bool:
    """SPEC section 6: only ``*.json`` names that do not start with a dot are staging files."""
    return name.endswith(".json") and not name.startswith(".")


def list_staging(mdir: MemoryDir) -> list[str]:
    """The staging-file names in ``staging/`` (of any file type: :meth:`process` checks).

    ``staging/`` is opened without following a symbolic link (SPEC 6): a ``staging/`` that is a
    link, or is missing, has no staging files. :meth:`Pipeline.scan` also says why in the log.
    """
    try:
        with (
            fsio.opened_dir(mdir.path) as mem_fd,
            fsio.opened_dir(STAGING, mem_fd) as staging_fd,
        ):
            return staging_names(os.listdir(staging_fd))
    except OSError:
        return []


def staging_names(listing: list[str], *, sort: bool = True) -> list[str]:
    """The staging-file names of a listing of ``staging/``, sorted unless ``sort`` is false."""
    # is_staging_name, inlined: this runs over every name at every rescan.
    names = [n for n in listing if n.endswith(".json") and n[:1] != "."]
    if sort:
        names.sort()
    return names


def skip_reason(st: os.stat_result) -> str | None:
    """Why an entry named like a staging file is not one (SPEC 6), or ``None`` for a file."""
    if stat.S_ISLNK(st.st_mode):
        return "symbolic link: never followed"
    if stat.S_ISDIR(st.st_mode):
        return "a directory, not a staging file"
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file (FIFO, socket or device)"
    return None


def _is_link(err: OSError, dir_fd: int | None, name: str) -> bool:
    """Did opening a directory fail because it is a symbolic link (``O_NOFOLLOW``)?

    With ``O_DIRECTORY`` Linux reports a link as ``ENOTDIR``, not ``ELOOP``: look.
    """
    if err.errno not in (errno.ELOOP, errno.ENOTDIR):
        return False
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _reason(err: OSError) -> str:
    return f"{err.strerror or err}" + (f": {err.filename}" if err.filename else "")


class Pipeline:
    """Decides staging files of any number of memory dirs; stateless between calls."""

    def __init__(
        self,
        options: Options,
        logger: Any,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.options = options
        self.log = logger
        self.clock = clock
        #: While :meth:`decide_batch` runs: the decisions waiting to be carried out, and the
        #: memory dir and ``staging/`` it opened once for all of them.
        self._batch: list[_Pending] | None = None
        self._dirs: tuple[int, int] | None = None
        self._stamp: tuple[int, str] = (-1, "")

    # -- one file -----------------------------------------------------------------------------

    def process(self, mdir: MemoryDir, name: str) -> Outcome:
        """Decide ``staging/<name>`` of ``mdir`` and carry the decision out; never raises."""
        started = time.perf_counter()
        event: dict[str, Any] = {"path": os.path.join(mdir.staging, name), "memory_dir": mdir.path}
        if self.options.dry_run:
            event["dry_run"] = True
        try:
            outcome = self._process(mdir, name, event)
        except OSError as err:
            event.setdefault("reasons", []).append(f"I/O error, will retry: {_reason(err)}")
            outcome = Outcome(Decision.DEFERRED, retry_at=self.clock() + self.options.settle)
            event["decision"] = Decision.DEFERRED.value
            event["level_hint"] = "error"
        except Exception as err:  # noqa: BLE001 - a bug must not stop the daemon; it is logged
            event.setdefault("reasons", []).append(f"internal error, file left as it is: {err!r}")
            event["traceback"] = traceback.format_exc()
            outcome = Outcome(Decision.DEFERRED, retry_at=self.clock() + self.options.settle)
            event["decision"] = Decision.DEFERRED.value
            event["level_hint"] = "error"
        if outcome is _PENDING:
            self._batch[-1].started = started  # type: ignore[index]
            return outcome
        event["duration_ms"] = round((time.perf_counter() - started) * 1000, 3)
        self._emit(event)
        return outcome

    def process_batch(self, mdir: MemoryDir, names: list[str]) -> dict[str, Outcome]:
        """Decide ``names`` and carry their decisions out in batches (``--once``'s backlog)."""
        outcomes: dict[str, Outcome] = {}
        for batch in self.batches(mdir, names):
            outcomes.update(batch.outcomes)
        return outcomes

    def batches(self, mdir: MemoryDir, names: list[str]) -> Iterator[Batch]:
        """:meth:`decide_batch`, :meth:`apply_batch` and :meth:`finish_batch`, batch by batch.

        One thread on purpose: applying a batch in a second thread while the next is decided
        was tried and measured slower (docs/performance.md): handing the GIL back and forth
        between the two cost more CPU than the waits for the disk it hid.
        """
        todo = iter(names)
        while batch := self.decide_batch(mdir, todo):
            self.apply_batch(batch)
            self.finish_batch(batch)
            yield batch

    def decide_batch(self, mdir: MemoryDir, names: Iterator[str]) -> Batch:
        """Read and decide the next files of ``names`` as :meth:`process` does, change nothing.

        Takes up to :data:`BATCH` files, fewer when their pending bytes reach
        :data:`BATCH_BYTES`; an empty batch means ``names`` is exhausted. Valid, foreign, skipped
        and deferred files are final (and logged) at once; repairs and quarantines wait in the
        batch for :meth:`apply_batch`. The memory dir and ``staging/`` are opened once for the
        batch. Too-large files (copied in chunks) and dry runs are carried out one by one.
        """
        batch = Batch(mdir)
        if self.options.dry_run:
            for name in itertools.islice(names, BATCH):
                batch.outcomes[name] = self.process(mdir, name)
            return batch
        try:
            dirs: tuple[int, int] | None = _open_memory_dir(mdir)
        except OSError:
            dirs = None  # process() opens them per file and says why, file by file
        self._batch = []
        self._dirs = dirs
        held = 0
        try:
            for name in itertools.islice(names, BATCH):
                outcome = batch.outcomes[name] = self.process(mdir, name)
                if outcome is _PENDING:
                    item = self._batch[-1]
                    held += len(item.data) + len(item.verdict.new_bytes or b"")
                    if held >= BATCH_BYTES:
                        break
        finally:
            batch.pending, self._batch, self._dirs = self._batch, None, None
            for fd in reversed(dirs or ()):
                os.close(fd)
        return batch

    def apply_batch(self, batch: Batch) -> None:
        """Carry out a batch's repairs and quarantines: one ``syncfs``, one fsync per directory.

        The rewrites and quarantines are written without an fsync each, made durable by one
        ``syncfs``, given their names (dead-letter files) and one fsync per directory, and only
        then do staging files get replaced or removed, followed by one fsync of ``staging/``.
        SPEC 5's order holds for every file; the fsyncs are shared. :meth:`finish_batch` logs
        the decisions.
        """
        if not batch.pending:
            return
        mdir, pending, outcomes = batch.mdir, batch.pending, batch.outcomes
        try:
            with (
                fsio.opened_dir(mdir.path) as mem_fd,
                fsio.opened_dir(STAGING, mem_fd) as staging_fd,
                canonical_lock(mem_fd, self._on_stale),
            ):
                self._apply_locked(mem_fd, staging_fd, pending, outcomes)
        except LockHeld as held:
            for item in pending:
                if outcomes.get(item.name) is _PENDING:
                    item.event["decision"] = Decision.DEFERRED.value
                    item.event["reasons"] = [*item.event.get("reasons", []), str(held)]
                    outcomes[item.name] = Outcome(
                        Decision.DEFERRED, item.identity, blocked_by_lock=True
                    )
        except OSError as err:
            for item in pending:
                if outcomes.get(item.name) is _PENDING:
                    item.event["decision"] = Decision.DEFERRED.value
                    item.event["level_hint"] = "error"
                    item.event["reasons"] = [
                        *item.event.get("reasons", []),
                        f"I/O error, will retry: {_reason(err)}",
                    ]
                    outcomes[item.name] = Outcome(
                        Decision.DEFERRED,
                        item.identity,
                        retry_at=self.clock() + self.options.settle,
                    )
        for item in pending:
            item.event["duration_ms"] = round((time.perf_counter() - item.started) * 1000, 3)

    def finish_batch(self, batch: Batch) -> None:
        """Log the decisions :meth:`apply_batch` carried out."""
        for item in batch.pending:
            self._emit(item.event)

    def _apply_locked(
        self,
        mem_fd: int,
        staging_fd: int,
        pending: list[_Pending],
        outcomes: dict[str, Outcome],
    ) -> None:
        live: list[_Pending] = []
        ours: list[tuple[int, str]] = []  # temp files not yet installed or handed on
        dirs: tuple[int, int] | None = None  # deadletter/ and originals/, once needed
        try:
            for item in pending:
                early = self._unchanged(staging_fd, item.name, item.identity)
                if early is not None:
                    outcomes[item.name] = _finish(item.event, item.identity, early, item.identity)
                    continue
                dirs = self._write_unsynced(mem_fd, staging_fd, item, dirs, ours)
                live.append(item)
            fsio.crash_point("batch-written")
            fsio.syncfs(mem_fd)  # every temp file's data is durable from here on
            for item in live:
                for dir_fd, tmp, final in item.installs:
                    _install(dir_fd, tmp, final)
                    ours.remove((dir_fd, tmp))
                    fsio.crash_point("record-written")
            if dirs is not None:
                fsio.fsync_dir(dirs[1])
                fsio.fsync_dir(dirs[0])
                fsio.fsync_dir(mem_fd)
                fsio.crash_point("deadletter-synced")
            for item in live:
                if item.tmp is not None:
                    # Durable since the syncfs: only now may it carry a name recovery would keep.
                    ready = fsio.temp_name("new", item.name)
                    os.rename(item.tmp, ready, src_dir_fd=staging_fd, dst_dir_fd=staging_fd)
                    ours.remove((staging_fd, item.tmp))  # _replace owns it now
                    item.tmp = ready
                    assert item.verdict.new_bytes is not None
                    applied, final_id = self._replace(
                        staging_fd,
                        item.name,
                        item.identity,
                        item.verdict.new_bytes,
                        tmp=item.tmp,
                        sync_dir=False,
                    )
                else:
                    applied = self._remove(staging_fd, item.name, item.identity, sync_dir=False)
                    final_id = item.identity
                outcomes[item.name] = _finish(item.event, item.identity, applied, final_id)
            fsio.fsync_dir(staging_fd)
        finally:
            for dir_fd, tmp in ours:
                fsio.unlink_quietly(dir_fd, tmp)
            for fd in dirs or ():
                os.close(fd)

    @staticmethod
    def _write_unsynced(
        mem_fd: int,
        staging_fd: int,
        item: _Pending,
        dirs: tuple[int, int] | None,
        ours: list[tuple[int, str]],
    ) -> tuple[int, int] | None:
        """Write an item's dead-letter files and rewrite as temp files, without fsync."""
        verdict = item.verdict
        if verdict.deadletter:
            assert verdict.original is not None
            if dirs is None:
                dl_fd = _open_deadletter(mem_fd)
                try:
                    dirs = (dl_fd, fsio.open_dir(ORIGINALS_DIR, dl_fd, create=True))
                except OSError:
                    os.close(dl_fd)
                    raise
            wanted = [(dirs[1], verdict.original, item.data)]
            wanted += [(dirs[0], r.name, r.body) for r in verdict.deadletter]
            for dir_fd, final, body in wanted:
                if fsio.lstat_at(dir_fd, final) is None:
                    tmp = fsio.write_temp(dir_fd, body, "rec", final, sync=False)
                    ours.append((dir_fd, tmp))
                    item.installs.append((dir_fd, tmp, final))
        if verdict.decision is Decision.REPAIRED:
            assert verdict.new_bytes is not None
            # Named ``part`` until the batch's syncfs: a crash before it may leave the temp
            # partial, and recovery deletes ``part`` temps rather than keeping them as versions.
            item.tmp = fsio.write_temp(
                staging_fd, verdict.new_bytes, fsio.PARTIAL, item.name, sync=False
            )
            ours.append((staging_fd, item.tmp))
            fsio.crash_point("temp-written")
        return dirs

    def scan(
        self, mdir: MemoryDir, listing: list[str] | None = None, *, sort: bool = True
    ) -> list[str]:
        """:func:`list_staging`, and a ``skipped`` event when ``staging/`` is a symbolic link.

        ``listing``: what :meth:`recover_temps` just read of ``staging/``, if it returned one.
        ``sort=False`` leaves a ``listing``'s names in directory order, for a caller that sorts
        only those it will read (sorting 10,000 names is a twentieth of a rescan of decided files).
        """
        path = mdir.staging
        try:
            st = os.lstat(path)
        except OSError:
            return []
        if stat.S_ISLNK(st.st_mode):
            self._emit(
                {
                    "path": path,
                    "memory_dir": mdir.path,
                    "decision": Decision.SKIPPED.value,
                    "reasons": ["staging/ is a symbolic link: never followed"],
                }
            )
            return []
        if listing is not None:
            return staging_names(listing, sort=sort)
        return list_staging(mdir)

    def _emit(self, event: dict[str, Any]) -> None:
        hint = event.pop("level_hint", None)
        if hint == "error":
            self.log.error("decision", **event)
        elif event.get("decision") == Decision.QUARANTINED.value:
            self.log.warning("decision", **event)
        else:
            self.log.info("decision", **event)

    def _process(self, mdir: MemoryDir, name: str, event: dict[str, Any]) -> Outcome:
        def finish(decision: Decision, *reasons: str, **extra: Any) -> Outcome:
            event["decision"] = decision.value
            if reasons:
                event["reasons"] = [*event.get("reasons", []), *reasons]
            return Outcome(decision, **extra)

        if not is_staging_name(name):
            return finish(Decision.SKIPPED, "not a staging file name")
        if self._dirs is not None:  # a batch opened them for all of its files
            return self._process_in(mdir, name, event, *self._dirs, finish)
        try:
            mem_fd = fsio.open_dir(mdir.path)
        except OSError as err:
            if _is_link(err, None, mdir.path):
                return finish(Decision.SKIPPED, "the memory dir is a symbolic link: never followed")
            raise
        try:
            try:
                staging_fd = fsio.open_dir(STAGING, mem_fd)
            except OSError as err:
                if _is_link(err, mem_fd, STAGING):
                    return finish(Decision.SKIPPED, "staging/ is a symbolic link: never followed")
                raise
            try:
                return self._process_in(mdir, name, event, mem_fd, staging_fd, finish)
            finally:
                os.close(staging_fd)
        finally:
            os.close(mem_fd)

    def _process_in(
        self,
        mdir: MemoryDir,
        name: str,
        event: dict[str, Any],
        mem_fd: int,
        staging_fd: int,
        finish: Callable[..., Outcome],
    ) -> Outcome:
        held = self._lock_held(mem_fd)
        if held is not None:
            return finish(Decision.DEFERRED, str(LockHeld(held)), blocked_by_lock=True)
        st = fsio.lstat_at(staging_fd, name)
        if st is None:
            return finish(Decision.SKIPPED, "vanished before it could be read")
        reason = skip_reason(st)
        if reason is not None:
            return finish(Decision.SKIPPED, reason, identity=Identity.of(st))
        # Only the open is mapped to skipped/deferred: an error while the decision is
        # carried out (deadletter/ a link, read-only, full) must stay a retried I/O error.
        try:
            fd, st = fsio.open_regular_fd(staging_fd, name)
        except OSError as err:
            if err.errno in (errno.ELOOP, errno.EINVAL, errno.ENXIO):
                return finish(Decision.SKIPPED, "replaced by a link or special file")
            if err.errno == errno.ENOENT:
                return finish(Decision.SKIPPED, "vanished before it could be read")
            if err.errno in (errno.EACCES, errno.EPERM):
                return finish(Decision.DEFERRED, "cannot read it: permission denied")
            raise
        try:
            return self._decide_open(mdir, name, mem_fd, staging_fd, fd, st, event)
        finally:
            os.close(fd)

    def _lock_held(self, mem_fd: int) -> LockInfo | None:
        info = read_lock(mem_fd)
        if info is None:
            return None
        if info.alive:
            return info
        try:
            removed = remove_stale_own_lock(mem_fd, info)
        except FileNotFoundError:
            return None  # released meanwhile
        self._on_stale(info, removed)
        return None

    def _on_stale(self, info: LockInfo, removed: bool) -> None:
        self.log.warning(
            "lock_seen",
            lock="canonical-writer.lock",
            pid=info.pid,
            owner=info.owner,
            alive=False,
            action="removed (memstaged's own, its process is gone)" if removed else "not obeyed",
        )

    def _decide_open(
        self,
        mdir: MemoryDir,
        name: str,
        mem_fd: int,
        staging_fd: int,
        fd: int,
        st: os.stat_result,
        event: dict[str, Any],
    ) -> Outcome:
        now = self.clock()
        identity = Identity.of(st)
        ctx = Context(
            project_root=mdir.project_root,
            file_name=name,
            source_path=event["path"],
            settled=now - st.st_mtime >= self.options.settle,
            split_invalid_candidates=self.options.split_invalid_candidates,
            decided_at=self._decided_at(int(now * 1000)),
        )
        limit = self.options.max_file_size
        data = None if st.st_size > limit else fsio.read_fd(fd, st.st_size, limit)
        if data is None:
            if not self.options.dry_run:
                return self._quarantine_too_large(
                    mem_fd, staging_fd, name, fd, identity, ctx, event
                )
            sha, size = fsio.hash_fd(fd)
            verdict = decide_too_large(ctx, sha, size, limit)
        else:
            verdict = decide(data, ctx)
        _describe(event, verdict)
        if verdict.decision is Decision.DEFERRED:
            return Outcome(Decision.DEFERRED, identity, retry_at=st.st_mtime + self.options.settle)
        if self.options.dry_run or verdict.decision not in (
            Decision.REPAIRED,
            Decision.QUARANTINED,
        ):
            return Outcome(verdict.decision, identity)

        if self._batch is not None and data is not None:
            self._batch.append(_Pending(name, identity, verdict, data, event, 0.0))
            return _PENDING

        def apply() -> tuple[_Applied, Identity]:
            early = self._unchanged(staging_fd, name, identity)
            if early is not None:
                return early, identity  # nothing written: the newer version is decided afresh
            if verdict.deadletter:
                self._write_deadletter(mem_fd, verdict, data, None)
            if verdict.decision is Decision.REPAIRED:
                assert verdict.new_bytes is not None
                return self._replace(staging_fd, name, identity, verdict.new_bytes)
            return self._remove(staging_fd, name, identity), identity

        return self._locked(mem_fd, identity, event, apply)

    def _locked(
        self,
        mem_fd: int,
        identity: Identity,
        event: dict[str, Any],
        apply: Callable[[], tuple[_Applied, Identity]],
    ) -> Outcome:
        """Carry a decision out while holding ``canonical-writer.lock`` (SPEC 5).

        The lock covers every change of the decision (dead-letter files, temp files, the
        rewrite or removal), so nothing in the memory dir changes while the reconciler holds it.
        ``apply`` returns what happened and the identity of the version now decided: for a
        repair, the rewrite memstaged put in place, so that a rescan does not decide it again.
        """
        try:
            with canonical_lock(mem_fd, self._on_stale):
                applied, final = apply()
        except LockHeld as held:
            event["decision"] = Decision.DEFERRED.value
            event["reasons"] = [*event.get("reasons", []), str(held)]
            return Outcome(Decision.DEFERRED, identity, blocked_by_lock=True)
        return _finish(event, identity, applied, final)

    def _decided_at(self, epoch_ms: int) -> str:
        """``format_epoch_ms``, kept for the millisecond: a backlog decides ~10 files in one."""
        if self._stamp[0] != epoch_ms:
            self._stamp = (epoch_ms, format_epoch_ms(epoch_ms))
        return self._stamp[1]

    def _quarantine_too_large(
        self,
        mem_fd: int,
        staging_fd: int,
        name: str,
        fd: int,
        identity: Identity,
        ctx: Context,
        event: dict[str, Any],
    ) -> Outcome:
        """SPEC 6: copy the file in bounded chunks (never read whole), then quarantine it."""
        limit = self.options.max_file_size
        event.update(
            decision=Decision.QUARANTINED.value,
            size=identity.size,
            reasons=[f"file too large ({identity.size} bytes, limit {limit})"],
        )

        def apply() -> tuple[_Applied, Identity]:
            early = self._unchanged(staging_fd, name, identity)
            if early is not None:
                return early, identity  # no point copying a version that is already gone
            with (
                fsio.opened_dir(DEADLETTER, mem_fd, create=True) as dl_fd,
                fsio.opened_dir(ORIGINALS_DIR, dl_fd, create=True) as or_fd,
            ):
                tmp, sha, size = fsio.copy_to_temp(fd, or_fd, "orig", ctx.file_name)
                try:
                    fsio.crash_point("copy-written")
                    if Identity.of(os.fstat(fd)) != identity or size != identity.size:
                        return _Applied.CHANGED, identity
                    verdict = decide_too_large(ctx, sha, size, limit)
                    _describe(event, verdict)
                    self._write_deadletter(mem_fd, verdict, None, tmp)
                finally:
                    fsio.unlink_quietly(or_fd, tmp)  # a no-op once it was installed
            return self._remove(staging_fd, name, identity), identity

        return self._locked(mem_fd, identity, event, apply)

    # -- applying -------------------------------------------------------------------------------

    def _write_deadletter(
        self, mem_fd: int, verdict: Verdict, data: bytes | None, original_tmp: str | None
    ) -> None:
        """Originals and records, each complete under its final name, then all of it durable."""
        assert verdict.original is not None
        dl_fd = _open_deadletter(mem_fd)
        try:
            with fsio.opened_dir(ORIGINALS_DIR, dl_fd, create=True) as or_fd:
                if original_tmp is not None:
                    _install(or_fd, original_tmp, verdict.original)
                elif fsio.lstat_at(or_fd, verdict.original) is None:
                    assert data is not None
                    tmp = fsio.write_temp(or_fd, data, "orig", verdict.original)
                    _install(or_fd, tmp, verdict.original)
                fsio.crash_point("original-written")
                for record in verdict.deadletter:
                    if fsio.lstat_at(dl_fd, record.name) is None:
                        tmp = fsio.write_temp(dl_fd, record.body, "rec", record.name)
                        _install(dl_fd, tmp, record.name)
                        fsio.crash_point("record-written")
                # The files are fsynced; now their names (and the directories' own names).
                fsio.fsync_dir(or_fd)
                fsio.fsync_dir(dl_fd)
        finally:
            os.close(dl_fd)
        fsio.fsync_dir(mem_fd)
        fsio.crash_point("deadletter-synced")

    @staticmethod
    def _unchanged(staging_fd: int, name: str, identity: Identity) -> _Applied | None:
        """``None`` while ``name`` still holds the version that was read; else GONE or CONFLICT.

        A cheap check before anything is written or displaced: the usual conflict (a writer
        renamed a new version in while memstaged was deciding) then changes nothing at all.
        """
        current = fsio.lstat_at(staging_fd, name)
        if current is None:
            return _Applied.GONE
        return None if Identity.of(current) == identity else _Applied.CONFLICT

    def _replace(
        self,
        staging_fd: int,
        name: str,
        identity: Identity,
        new_bytes: bytes,
        *,
        tmp: str | None = None,
        sync_dir: bool = True,
    ) -> tuple[_Applied, Identity]:
        """Atomically put ``new_bytes`` in place of exactly the version that was read.

        The exchange hands back whatever it displaced. If that is not the version that was read
        (a writer renamed a newer one in between the check and the exchange), the writer's
        version is kept beside, under a ``.conflict-`` name, and never put back under ``name``:
        our rewrite was visible there for a moment, a writer may have read it and be about to
        rename its next version over ``name``, which would silently destroy the one put back.
        """
        if tmp is None:  # a batch passes a temp it wrote and made durable already
            tmp = fsio.write_temp(staging_fd, new_bytes, "new", name)
            fsio.crash_point("temp-written")
        # An exchange keeps inode, size and mtime: this is the rewrite's identity once in place.
        rewrite = Identity.of(os.stat(tmp, dir_fd=staging_fd, follow_symlinks=False))
        # Until the exchange the temp name holds only our rewrite; after it, the displaced
        # version, which may be a writer's and must then never be unlinked.
        tmp_is_ours = True
        try:
            early = self._unchanged(staging_fd, name, identity)
            if early is not None:
                return early, identity
            try:
                fsio.exchange(staging_fd, tmp, name)
            except FileNotFoundError:
                return _Applied.GONE, identity
            tmp_is_ours = False
            fsio.crash_point("exchanged")
            displaced = fsio.lstat_at(staging_fd, tmp)
            if displaced is not None and Identity.of(displaced) == identity:
                os.unlink(tmp, dir_fd=staging_fd)
                fsio.crash_point("replaced")
                if sync_dir:
                    fsio.fsync_dir(staging_fd)
                return _Applied.DONE, rewrite
            self._park(staging_fd, tmp, name)
            if sync_dir:
                fsio.fsync_dir(staging_fd)
            return _Applied.CONFLICT, identity
        finally:
            if tmp_is_ours:
                fsio.unlink_quietly(staging_fd, tmp)

    def _remove(
        self, staging_fd: int, name: str, identity: Identity, *, sync_dir: bool = True
    ) -> _Applied:
        """Remove exactly the version that was read; a newer one is kept, never lost.

        The file is renamed away to a temp name and checked there. A writer's version caught by
        that rename is kept under a ``.conflict-`` name rather than renamed back: while ``name``
        was absent a writer may have started a fresh file, whose rename would destroy it.
        """
        early = self._unchanged(staging_fd, name, identity)
        if early is not None:
            return early
        out = fsio.temp_name("out", name)
        try:
            os.rename(name, out, src_dir_fd=staging_fd, dst_dir_fd=staging_fd)
        except FileNotFoundError:
            return _Applied.GONE
        fsio.crash_point("renamed-away")
        moved = fsio.lstat_at(staging_fd, out)
        if moved is not None and Identity.of(moved) == identity:
            os.unlink(out, dir_fd=staging_fd)
            fsio.crash_point("removed")
            if sync_dir:
                fsio.fsync_dir(staging_fd)
            return _Applied.DONE
        self._park(staging_fd, out, name)
        if sync_dir:
            fsio.fsync_dir(staging_fd)
        return _Applied.CONFLICT

    def _park(self, staging_fd: int, tmp: str, name: str) -> str:
        """Keep a displaced writer version as a new staging file, to be decided on its own."""
        base = fsio.clip_name(stem(name), 180)
        for attempt in range(100):
            parked = f"{base}.conflict-{int(self.clock())}-{attempt}.json"
            try:
                fsio.rename_noreplace(staging_fd, tmp, staging_fd, parked)
            except FileExistsError:
                continue
            fsio.crash_point("parked")
            self.log.warning("conflict_parked", path=name, kept_as=parked)
            return parked
        raise OSError(errno.EEXIST, "no free name to keep a displaced version", name)

    # -- after a crash --------------------------------------------------------------------------

    def recover_temps(self, mdir: MemoryDir) -> list[str] | None:
        """Clean up what a killed memstaged left: delete only what is provably redundant.

        A temp file in the memory dir (a lock being taken) or in ``deadletter/`` only ever
        holds memstaged's own lock, record or copy: delete it. A temp file in ``staging/`` may
        hold a writer's version that was displaced at the moment of the crash, so it is deleted
        only when the same bytes (or their repair) are safe elsewhere; otherwise it is kept as a
        new staging file ``<stem>.conflict-<t>-<n>.json`` and decided on its own. Never raises:
        what cannot be cleaned up is logged.

        Returns the listing of ``staging/`` when it had no temp file (the usual case), so that
        :meth:`scan` need not list a directory of thousands of files a second time.
        """
        try:
            mem_fd = fsio.open_dir(mdir.path)
        except OSError:
            return None
        try:
            self._recover_plain(mem_fd, ".")
            self._recover_plain(mem_fd, DEADLETTER)
            self._recover_plain(mem_fd, f"{DEADLETTER}/{ORIGINALS_DIR}")
            try:
                staging_fd = fsio.open_dir(STAGING, mem_fd)
            except OSError:
                return None
            try:
                names = os.listdir(staging_fd)
                temps = sorted([n for n in names if n.startswith(fsio.TEMP_PREFIX)])
                if not temps:
                    return names
                for entry in temps:
                    parsed = fsio.parse_temp_name(entry)
                    if parsed is None:
                        continue
                    if parsed[0] == fsio.PARTIAL:  # still being written: never anyone's version
                        fsio.unlink_quietly(staging_fd, entry)
                        self.log.info("temp_recovered", path=f"{STAGING}/{entry}", action="deleted")
                        continue
                    try:
                        self._recover_staging_temp(
                            mdir, mem_fd, staging_fd, entry, parsed[1], names
                        )
                    except OSError as err:
                        self.log.error(
                            "temp_recovered",
                            path=f"{STAGING}/{entry}",
                            action=f"left alone: {_reason(err)}",
                        )
            finally:
                os.close(staging_fd)
        except OSError as err:
            self.log.error(
                "temp_recovered", memory_dir=mdir.path, action=f"stopped: {_reason(err)}"
            )
        finally:
            os.close(mem_fd)
        return None

    def _recover_plain(self, mem_fd: int, sub: str) -> None:
        try:
            fd = fsio.open_dir(sub, mem_fd) if sub != "." else os.dup(mem_fd)
        except OSError:
            return
        try:
            for entry in os.listdir(fd):
                if fsio.parse_temp_name(entry) is not None:
                    fsio.unlink_quietly(fd, entry)
                    self.log.info("temp_recovered", path=f"{sub}/{entry}", action="deleted")
        finally:
            os.close(fd)

    def _snapshot(self, dir_fd: int, name: str) -> tuple[str, bytes | None] | None:
        """sha256 and (unless larger than the size limit) the bytes of a regular file."""
        try:
            with fsio.open_regular(dir_fd, name) as (fd, _st):
                sha, size = fsio.hash_fd(fd)
                limit = self.options.max_file_size
                return sha, fsio.read_fd(fd, size, limit) if size <= limit else None
        except FileNotFoundError:
            return None

    def _recover_staging_temp(
        self,
        mdir: MemoryDir,
        mem_fd: int,
        staging_fd: int,
        entry: str,
        encoded_target: str,
        names: list[str],
    ) -> None:
        path = f"{STAGING}/{entry}"
        try:
            ours = self._snapshot(staging_fd, entry)
        except OSError as err:
            self.log.warning("temp_recovered", path=path, action=f"left alone: {_reason(err)}")
            return
        if ours is None:
            return  # gone meanwhile
        sha, data = ours
        target = fsio.resolve_target(encoded_target, names)
        theirs: tuple[str, bytes | None] | None = None
        if target is not None and is_staging_name(target):
            try:
                theirs = self._snapshot(staging_fd, target)
            except OSError:
                theirs = ("", None)  # something unreadable holds the name: keep ours beside it
        redundant = (theirs is not None and theirs[0] == sha) or self._in_originals(
            mem_fd, target, sha
        )
        if not redundant and data is not None and theirs is not None and theirs[1] is not None:
            assert target is not None
            current = theirs[1]
            ctx = Context(
                mdir.project_root,
                target,
                settled=True,
                split_invalid_candidates=self.options.split_invalid_candidates,
            )
            # One is the repair of the other: a rewrite that was (or was not yet) put in place.
            redundant = (
                decide(data, ctx).new_bytes == current or decide(current, ctx).new_bytes == data
            )
        if redundant:
            fsio.unlink_quietly(staging_fd, entry)
            action = "deleted: the same content is in staging/ or deadletter/"
        else:
            # Kept beside, never renamed back under the target's name: writers are back at
            # work, and one that found the name absent may be about to rename a fresh file there.
            action = f"kept as {self._park(staging_fd, entry, target or 'recovered.json')}"
        fsio.fsync_dir(staging_fd)
        fsio.crash_point("temp-recovered")
        self.log.warning("temp_recovered", path=path, action=action)

    @staticmethod
    def _in_originals(mem_fd: int, target: str | None, sha: str) -> bool:
        """Are these bytes already in ``deadletter/originals/`` (under the target's name)?"""
        try:
            with fsio.opened_dir(f"{DEADLETTER}/{ORIGINALS_DIR}", mem_fd) as or_fd:
                if target is not None:
                    return fsio.lstat_at(or_fd, original_name(target, sha)) is not None
                # The target's name is not known (too long to spell out, and gone): any
                # original with these exact bytes will do.
                suffix = original_name("x", sha)[1:]
                for name in os.listdir(or_fd):
                    if name.endswith(suffix):
                        with fsio.open_regular(or_fd, name) as (fd, _st):
                            if fsio.hash_fd(fd)[0] == sha:
                                return True
                return False
        except (FileNotFoundError, NotADirectoryError):
            return False


def _describe(event: dict[str, Any], verdict: Verdict) -> None:
    """Put what a verdict says into the decision's log event (SPEC 7)."""
    event.update(
        decision=verdict.decision.value,
        session_id=verdict.session_id,
        sha256=verdict.sha256,
        size=verdict.size,
        reasons=list(verdict.reasons),
    )
    if verdict.repairs:
        event["repairs"] = [msgspec.to_builtins(r) for r in verdict.repairs]
    if verdict.deadletter:
        event["deadletter"] = [f"{DEADLETTER}/{r.name}" for r in verdict.deadletter]
        event["deadletter"].append(f"{DEADLETTER}/{ORIGINALS_DIR}/{verdict.original}")


def _open_memory_dir(mdir: MemoryDir) -> tuple[int, int]:
    """The memory dir and its ``staging/``, opened without following links."""
    mem_fd = fsio.open_dir(mdir.path)
    try:
        return mem_fd, fsio.open_dir(STAGING, mem_fd)
    except OSError:
        os.close(mem_fd)
        raise


def _open_deadletter(mem_fd: int) -> int:
    """``deadletter/``, created 0700 if needed, never through a symbolic link."""
    try:
        return fsio.open_dir(DEADLETTER, mem_fd, create=True)
    except OSError as err:
        if err.errno in (errno.ELOOP, errno.ENOTDIR):
            raise OSError(
                err.errno, "deadletter/ is a symbolic link or not a directory: never followed"
            ) from None
        raise


def _finish(
    event: dict[str, Any], identity: Identity, applied: _Applied, final: Identity
) -> Outcome:
    """The outcome of a decision that was carried out, and what its event says about it."""
    if applied is _Applied.GONE:
        event["decision"] = Decision.SKIPPED.value
        event["reasons"] = [*event["reasons"], "vanished before the decision was applied"]
        return Outcome(Decision.SKIPPED, identity)
    if applied is _Applied.CHANGED:
        event["decision"] = Decision.DEFERRED.value
        event["reasons"] = [*event.get("reasons", []), "changed while being copied"]
        return Outcome(Decision.DEFERRED, identity, changed=True)
    if applied is _Applied.CONFLICT:
        event["decision"] = Decision.DEFERRED.value
        event["reasons"] = [
            *event["reasons"],
            "changed while being decided: the newer version is kept and decided afresh",
        ]
        return Outcome(Decision.DEFERRED, identity, changed=True)
    return Outcome(Decision(event["decision"]), final)


def _install(dir_fd: int, tmp: str, final: str) -> None:
    """Give a complete temp file its final name, unless that name already holds the same thing."""
    try:
        fsio.rename_noreplace(dir_fd, tmp, dir_fd, final)
    except FileExistsError:
        fsio.unlink_quietly(dir_fd, tmp)
