"""The file layer: read one staging file safely, decide it, carry the decision out, log it.

The daemon and ``--once`` both call :meth:`Pipeline.process`; it is the only code that changes
``staging/`` or ``deadletter/``. The order of every write follows SPEC section 5: what takes a
file's place is durable before the file is replaced or removed, and a version a writer renamed in
while memstaged worked is handed back by ``renameat2(RENAME_EXCHANGE)`` and kept, never overwritten.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import time
import traceback
from collections.abc import Callable
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


class _Applied(Enum):
    DONE = "done"
    CONFLICT = "conflict"
    GONE = "gone"


def is_staging_name(name: str) -> bool:
    """SPEC section 6: only ``*.json`` names that do not start with a dot are staging files."""
    return name.endswith(".json") and not name.startswith(".")


def list_staging(mdir: MemoryDir) -> list[str]:
    """The staging-file names in ``staging/`` (of any file type: :meth:`process` checks)."""
    try:
        with os.scandir(mdir.staging) as entries:
            return sorted(e.name for e in entries if is_staging_name(e.name))
    except (FileNotFoundError, NotADirectoryError):
        return []


def _skip_reason(st: os.stat_result) -> str | None:
    if stat.S_ISLNK(st.st_mode):
        return "symbolic link: never followed"
    if stat.S_ISDIR(st.st_mode):
        return "a directory, not a staging file"
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file (FIFO, socket or device)"
    return None


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
            reason = f"{err.strerror or err}" + (f": {err.filename}" if err.filename else "")
            event.setdefault("reasons", []).append(f"I/O error, will retry: {reason}")
            outcome = Outcome(Decision.DEFERRED, retry_at=self.clock() + self.options.settle)
            event["decision"] = Decision.DEFERRED.value
            event["level_hint"] = "error"
        except Exception as err:  # noqa: BLE001 - a bug must not stop the daemon; it is logged
            event.setdefault("reasons", []).append(f"internal error, file left as it is: {err!r}")
            event["traceback"] = traceback.format_exc()
            outcome = Outcome(Decision.DEFERRED, retry_at=self.clock() + self.options.settle)
            event["decision"] = Decision.DEFERRED.value
            event["level_hint"] = "error"
        event["duration_ms"] = round((time.perf_counter() - started) * 1000, 3)
        self._emit(event)
        return outcome

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
        with fsio.opened_dir(mdir.path) as mem_fd:
            try:
                staging_fd = fsio.open_dir(STAGING, mem_fd)
            except OSError as err:
                if err.errno == errno.ELOOP:
                    return finish(Decision.SKIPPED, "staging/ is a symbolic link: never followed")
                raise
            try:
                held = self._lock_held(mem_fd)
                if held is not None:
                    return finish(
                        Decision.DEFERRED,
                        f"canonical-writer.lock is held by live pid {held.pid}",
                        blocked_by_lock=True,
                    )
                st = fsio.lstat_at(staging_fd, name)
                if st is None:
                    return finish(Decision.SKIPPED, "vanished before it could be read")
                reason = _skip_reason(st)
                if reason is not None:
                    return finish(Decision.SKIPPED, reason, identity=Identity.of(st))
                try:
                    with fsio.open_regular(staging_fd, name) as (fd, st):
                        return self._decide_open(mdir, name, mem_fd, staging_fd, fd, st, event)
                except OSError as err:
                    if err.errno in (errno.ELOOP, errno.EINVAL, errno.ENXIO):
                        return finish(Decision.SKIPPED, "replaced by a link or special file")
                    if err.errno == errno.ENOENT:
                        return finish(Decision.SKIPPED, "vanished before it could be read")
                    if err.errno in (errno.EACCES, errno.EPERM):
                        return finish(Decision.DEFERRED, "cannot read it: permission denied")
                    raise
            finally:
                os.close(staging_fd)

    def _lock_held(self, mem_fd: int) -> LockInfo | None:
        info = read_lock(mem_fd)
        if info is None:
            return None
        if info.alive:
            return info
        self._on_stale(info, remove_stale_own_lock(mem_fd, info))
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
            decided_at=format_epoch_ms(int(now * 1000)),
        )
        limit = self.options.max_file_size
        data = None if st.st_size > limit else fsio.read_fd(fd, st.st_size, limit)
        original_tmp: str | None = None
        if data is None:
            verdict, original_tmp = self._too_large(ctx, mem_fd, fd, limit, identity)
            if verdict is None:
                event.update(decision="deferred", reasons=["changed while being copied"])
                return Outcome(Decision.DEFERRED, identity, changed=True)
        else:
            verdict = decide(data, ctx)
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
        if verdict.decision is Decision.DEFERRED:
            return Outcome(Decision.DEFERRED, identity, retry_at=st.st_mtime + self.options.settle)
        if self.options.dry_run or verdict.decision not in (
            Decision.REPAIRED,
            Decision.QUARANTINED,
        ):
            return Outcome(verdict.decision, identity)
        try:
            if verdict.deadletter:
                self._write_deadletter(mem_fd, verdict, data, original_tmp)
            if verdict.decision is Decision.REPAIRED:
                assert verdict.new_bytes is not None
                applied = self._replace(mem_fd, staging_fd, name, identity, verdict.new_bytes)
            else:
                applied = self._remove(mem_fd, staging_fd, name, identity)
        except LockHeld as held:
            event["decision"] = Decision.DEFERRED.value
            event["reasons"] = [*event["reasons"], str(held)]
            return Outcome(Decision.DEFERRED, identity, blocked_by_lock=True)
        if applied is _Applied.GONE:
            event["decision"] = Decision.SKIPPED.value
            event["reasons"] = [*event["reasons"], "vanished before the decision was applied"]
            return Outcome(Decision.SKIPPED, identity)
        if applied is _Applied.CONFLICT:
            event["decision"] = Decision.DEFERRED.value
            event["reasons"] = [
                *event["reasons"],
                "changed while being decided: the newer version is kept and decided afresh",
            ]
            return Outcome(Decision.DEFERRED, identity, changed=True)
        if verdict.decision is Decision.REPAIRED:
            # The rewrite is a new version; hand back its identity so a rescan does not redo it.
            new_st = fsio.lstat_at(staging_fd, name)
            return Outcome(verdict.decision, Identity.of(new_st) if new_st else None)
        return Outcome(verdict.decision, identity)

    # -- too large ----------------------------------------------------------------------------

    def _too_large(
        self, ctx: Context, mem_fd: int, fd: int, limit: int, identity: Identity
    ) -> tuple[Verdict | None, str | None]:
        """Copy (or, in a dry run, hash) a file in bounded chunks, never reading it whole."""
        if self.options.dry_run:
            digest = hashlib.sha256()
            size = 0
            os.lseek(fd, 0, os.SEEK_SET)
            while chunk := os.read(fd, fsio.CHUNK):
                digest.update(chunk)
                size += len(chunk)
            return decide_too_large(ctx, digest.hexdigest(), size, limit), None
        with (
            fsio.opened_dir(DEADLETTER, mem_fd, create=True) as dl_fd,
            fsio.opened_dir(ORIGINALS_DIR, dl_fd, create=True) as or_fd,
        ):
            tmp, sha, size = fsio.copy_to_temp(fd, or_fd, "orig", ctx.file_name)
            if Identity.of(os.fstat(fd)) != identity or size != identity.size:
                fsio.unlink_quietly(or_fd, tmp)
                return None, None
        return decide_too_large(ctx, sha, size, limit), tmp

    # -- applying -------------------------------------------------------------------------------

    def _write_deadletter(
        self, mem_fd: int, verdict: Verdict, data: bytes | None, original_tmp: str | None
    ) -> None:
        """Originals and records, each complete under its final name, then all of it durable."""
        assert verdict.original is not None
        with (
            fsio.opened_dir(DEADLETTER, mem_fd, create=True) as dl_fd,
            fsio.opened_dir(ORIGINALS_DIR, dl_fd, create=True) as or_fd,
        ):
            if original_tmp is not None:
                _install(or_fd, original_tmp, verdict.original)
            elif fsio.lstat_at(or_fd, verdict.original) is None:
                assert data is not None
                tmp = fsio.write_temp(or_fd, data, "orig", verdict.original)
                _install(or_fd, tmp, verdict.original)
            for record in verdict.deadletter:
                if fsio.lstat_at(dl_fd, record.name) is None:
                    tmp = fsio.write_temp(dl_fd, record.body, "rec", record.name)
                    _install(dl_fd, tmp, record.name)
            fsio.fsync_dir(or_fd)
            fsio.fsync_dir(dl_fd)
        fsio.fsync_dir(mem_fd)

    def _replace(
        self, mem_fd: int, staging_fd: int, name: str, identity: Identity, new_bytes: bytes
    ) -> _Applied:
        """Atomically put ``new_bytes`` in place of exactly the version that was read."""
        tmp = fsio.write_temp(staging_fd, new_bytes, "new", name)
        ours = os.stat(tmp, dir_fd=staging_fd, follow_symlinks=False).st_ino
        # Until the exchange, and again once it hands our file back, the temp name holds only
        # our rewrite; in between it may hold a writer's version, which must never be unlinked.
        tmp_is_ours = True
        try:
            with canonical_lock(mem_fd, self._on_stale):
                try:
                    fsio.exchange(staging_fd, tmp, name)
                except FileNotFoundError:
                    return _Applied.GONE
                tmp_is_ours = False
                displaced = fsio.lstat_at(staging_fd, tmp)
                if displaced is not None and Identity.of(displaced) == identity:
                    os.unlink(tmp, dir_fd=staging_fd)
                    fsio.fsync_dir(staging_fd)
                    return _Applied.DONE
                # A writer put a newer version in place after the read: give it back.
                fsio.exchange(staging_fd, tmp, name)
                back = fsio.lstat_at(staging_fd, tmp)
                if back is not None and back.st_ino == ours:
                    tmp_is_ours = True
                else:
                    # ...and yet another one replaced our rewrite meanwhile: the newest goes back
                    # in place, the one it displaced is kept under a new staging name.
                    fsio.exchange(staging_fd, tmp, name)
                    self._park(staging_fd, tmp, name)
                fsio.fsync_dir(staging_fd)
                return _Applied.CONFLICT
        finally:
            if tmp_is_ours:
                fsio.unlink_quietly(staging_fd, tmp)

    def _remove(self, mem_fd: int, staging_fd: int, name: str, identity: Identity) -> _Applied:
        """Remove exactly the version that was read; a newer one is put back, never lost."""
        with canonical_lock(mem_fd, self._on_stale):
            out = fsio.temp_name("out", name)
            try:
                os.rename(name, out, src_dir_fd=staging_fd, dst_dir_fd=staging_fd)
            except FileNotFoundError:
                return _Applied.GONE
            moved = fsio.lstat_at(staging_fd, out)
            if moved is not None and Identity.of(moved) == identity:
                os.unlink(out, dir_fd=staging_fd)
                fsio.fsync_dir(staging_fd)
                return _Applied.DONE
            try:
                fsio.rename_noreplace(staging_fd, out, staging_fd, name)
            except FileExistsError:
                self._park(staging_fd, out, name)
            fsio.fsync_dir(staging_fd)
            return _Applied.CONFLICT

    def _park(self, staging_fd: int, tmp: str, name: str) -> str:
        """Keep a displaced writer version as a new staging file, to be decided on its own."""
        for attempt in range(100):
            parked = f"{stem(name)[:180]}.conflict-{int(self.clock())}-{attempt}.json"
            try:
                fsio.rename_noreplace(staging_fd, tmp, staging_fd, parked)
            except FileExistsError:
                continue
            self.log.warning("conflict_parked", path=name, kept_as=parked)
            return parked
        raise OSError(errno.EEXIST, "no free name to keep a displaced version", name)

    # -- after a crash --------------------------------------------------------------------------

    def recover_temps(self, mdir: MemoryDir) -> None:
        """Clean up what a killed memstaged left: delete only what is provably redundant.

        A temp file in ``deadletter/`` only ever holds memstaged's own record or copy: delete it.
        A temp file in ``staging/`` may hold a writer's version that was displaced at the moment
        of the crash, so it is deleted only when the same bytes are safe elsewhere; otherwise it
        is put back under its name, or kept under a new staging name.
        """
        try:
            mem_fd = fsio.open_dir(mdir.path)
        except FileNotFoundError:
            return
        try:
            self._recover_deadletter(mem_fd)
            try:
                staging_fd = fsio.open_dir(STAGING, mem_fd)
            except (FileNotFoundError, NotADirectoryError):
                return
            try:
                for entry in sorted(os.listdir(staging_fd)):
                    parsed = fsio.parse_temp_name(entry)
                    if parsed is not None:
                        self._recover_staging_temp(mdir, mem_fd, staging_fd, entry, parsed[1])
            finally:
                os.close(staging_fd)
        finally:
            os.close(mem_fd)

    def _recover_deadletter(self, mem_fd: int) -> None:
        for sub in (DEADLETTER, f"{DEADLETTER}/{ORIGINALS_DIR}"):
            try:
                fd = fsio.open_dir(sub, mem_fd)
            except (FileNotFoundError, NotADirectoryError):
                continue
            try:
                for entry in os.listdir(fd):
                    if fsio.parse_temp_name(entry) is not None:
                        fsio.unlink_quietly(fd, entry)
                        self.log.info("temp_recovered", path=f"{sub}/{entry}", action="deleted")
            finally:
                os.close(fd)

    def _read_at(self, dir_fd: int, name: str) -> bytes | None:
        try:
            with fsio.open_regular(dir_fd, name) as (fd, st):
                return fsio.read_fd(fd, st.st_size, self.options.max_file_size)
        except OSError:
            return None

    def _recover_staging_temp(
        self, mdir: MemoryDir, mem_fd: int, staging_fd: int, entry: str, target: str
    ) -> None:
        data = self._read_at(staging_fd, entry)
        path = f"{STAGING}/{entry}"
        if data is None:
            self.log.warning("temp_recovered", path=path, action="left alone: cannot read it")
            return
        current = self._read_at(staging_fd, target) if is_staging_name(target) else None
        sha = hashlib.sha256(data).hexdigest()
        redundant = data == current or self._in_originals(mem_fd, target, sha)
        if not redundant and current is not None:
            ctx = Context(
                mdir.project_root,
                target,
                settled=True,
                split_invalid_candidates=self.options.split_invalid_candidates,
            )
            ours = decide(data, ctx)
            theirs = decide(current, ctx)
            redundant = ours.new_bytes == current or theirs.new_bytes == data
        if redundant:
            fsio.unlink_quietly(staging_fd, entry)
            action = "deleted: the same content is in staging/ or deadletter/"
        elif current is None and is_staging_name(target):
            try:
                fsio.rename_noreplace(staging_fd, entry, staging_fd, target)
                action = f"restored as {target}"
            except FileExistsError:
                action = f"kept as {self._park(staging_fd, entry, target)}"
        else:
            action = f"kept as {self._park(staging_fd, entry, target or 'recovered.json')}"
        fsio.fsync_dir(staging_fd)
        self.log.warning("temp_recovered", path=path, action=action)

    @staticmethod
    def _in_originals(mem_fd: int, target: str, sha: str) -> bool:
        try:
            with fsio.opened_dir(f"{DEADLETTER}/{ORIGINALS_DIR}", mem_fd) as or_fd:
                return fsio.lstat_at(or_fd, original_name(target, sha)) is not None
        except (FileNotFoundError, NotADirectoryError):
            return False


def _install(dir_fd: int, tmp: str, final: str) -> None:
    """Give a complete temp file its final name, unless that name already holds the same thing."""
    try:
        fsio.rename_noreplace(dir_fd, tmp, dir_fd, final)
    except FileExistsError:
        fsio.unlink_quietly(dir_fd, tmp)
