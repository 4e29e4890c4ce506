"""The one transaction, driven directly with hand-built plans on a temp dir (issue 20 item 6).

Each test builds :class:`~memstaged.files.plan.Plan` values by hand (no triage, no pipeline), hands
them to :func:`memstaged.files.transaction.apply` (or :func:`~memstaged.files.transaction.begin` and
``commit``, with the caller's own check between them) on a real memory dir, and checks the
bytes on disk, the :class:`~memstaged.files.plan.Result` it hands back, and what it announced before
it carried anything out. The crash test runs the same plans in a child process killed
(SIGKILL) at each named ``crash_point``, then runs crash recovery, and checks that nothing is
lost. The last tests check that a stale lock the transaction removed is logged however it ends.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest
from support.daemon_fakes import RecordingLogger
from support.documents import lesson, staging_doc
from support.helpers import PYTHON, REPO, make_memory_dir, memory_dir_of, project_root_of

from memstaged.core.decide import Decision
from memstaged.core.records import Origin, original_name, whole_file_record
from memstaged.deadletter.changes import Waiter
from memstaged.deadletter.purge import purge
from memstaged.files import fsio, temp_names, temp_recovery
from memstaged.files.fsio import Identity
from memstaged.files.locks import CANONICAL_LOCK
from memstaged.files.memdir import Options
from memstaged.files.plan import Action, Held, Plan, Settled, Status
from memstaged.files.transaction import apply, begin
from memstaged.files.version import Version, read_version
from memstaged.run.pipeline import Pipeline

#: Old enough that a refreshed age is plainly newer.
_OLD: int = 1_600_000_000


def _bytes(mdir: Path, session: str = "s1") -> bytes:
    body = staging_doc(project_root_of(mdir), session, candidates={"lessons": [lesson("cid-1")]})
    return json.dumps(body).encode()


@contextmanager
def _opened(mdir: Path) -> Iterator[tuple[int, int]]:
    mem_fd = fsio.open_dir(str(mdir))
    staging_fd = fsio.open_dir("staging", mem_fd)
    try:
        yield mem_fd, staging_fd
    finally:
        os.close(staging_fd)
        os.close(mem_fd)


def _version(staging_fd: int, name: str, limit: int = 1 << 20) -> Version:
    read = read_version(staging_fd, name, limit)
    assert isinstance(read, Version), read
    return read


def _quarantine(version: Version, data: bytes | None, action: Action = Action.REMOVE) -> Plan:
    """A quarantine of ``version``: its original and one whole-file record, built by hand."""
    sha = hashlib.sha256(data if data is not None else b"too large").hexdigest()
    origin = Origin(
        file_name=version.name,
        source_path=f"staging/{version.name}",
        sha256=sha,
        size=version.identity.size,
        decided_at="2026-01-01T00:00:00.000Z",
        errors=("hand-built: not a valid staging file",),
    )
    record = whole_file_record(None if data is None else data.decode(), origin)
    return Plan(
        key=version.name,
        action=action,
        version=version,
        original=original_name(version.name, sha),
        records=(record,),
    )


def _rewrite(version: Version, new: bytes) -> Plan:
    """A repair of ``version``: ``new`` in its place, its old bytes kept as an original (R6)."""
    assert version.data is not None
    sha = hashlib.sha256(version.data).hexdigest()
    return Plan(
        key=version.name,
        action=Action.REWRITE,
        version=version,
        data=new,
        original=original_name(version.name, sha),
    )


class _Announcements:
    """The ``announce`` of a test: what was announced, and the staging files present then."""

    def __init__(self, staging: Path) -> None:
        self.staging = staging
        self.settled: list[Settled] = []
        self.present: list[set[str]] = []

    def __call__(self, settled: Sequence[Settled]) -> None:
        self.settled.extend(settled)
        self.present.append({p.name for p in self.staging.iterdir()})


def _dl(mdir: Path) -> dict[str, bytes]:
    """Every regular file under deadletter/ (``originals/<name>`` for originals)."""
    out: dict[str, bytes] = {}
    root = mdir / "deadletter"
    for path in sorted(root.rglob("*")) if root.exists() else []:
        if path.is_file():
            out[str(path.relative_to(root))] = path.read_bytes()
    return out


def _temps(mdir: Path) -> list[str]:
    return [p.name for p in mdir.rglob(f"{temp_names.TEMP_PREFIX}*")]


# -- names ----------------------------------------------------------------------------------------


def test_a_taken_name_gives_another_and_the_records_point_at_the_original_really_written(
    tmp_path: Path,
) -> None:
    """Issue 20 item 6 (name collision), SPEC 4: a file of someone else's at the original's and
    at the record's planned names is never replaced or trusted; the transaction takes the next
    free names, the record it writes names the original under its real name, the result and the
    announcement (made before the staging file was touched) say the real names, and the foreign
    files are byte-exact."""
    mdir = make_memory_dir(tmp_path)
    data = b'{"not": "a staging file"}'
    (mdir / "staging" / "x.json").write_bytes(data)
    with _opened(mdir) as (mem_fd, staging_fd):
        version = _version(staging_fd, "x.json")
        plan = _quarantine(version, data)
        originals = mdir / "deadletter" / "originals"
        originals.mkdir(parents=True)
        assert plan.original is not None
        (originals / plan.original).write_bytes(b"someone else's original")
        (mdir / "deadletter" / plan.records[0].name).write_bytes(b"someone else's record")
        heard = _Announcements(mdir / "staging")
        applied = apply(mem_fd, staging_fd, [plan], announce=heard, now=1.0)
        version.close()
    result = applied.results["x.json"]
    assert result.status is Status.DONE
    record_alt = plan.records[0].name.removesuffix(".json") + ".2.json"
    original_alt = plan.original.removesuffix(".orig") + ".2.orig"
    assert result.original == original_alt
    assert result.records == (record_alt,)
    assert heard.settled == [Settled("x.json", (record_alt,), original_alt, None)]
    assert heard.present == [{"x.json"}]  # announced before the file was removed
    store = _dl(mdir)
    assert store[f"originals/{plan.original}"] == b"someone else's original"
    assert store[plan.records[0].name] == b"someone else's record"
    assert store[f"originals/{original_alt}"] == data
    assert json.loads(store[record_alt])["memstaged"]["original"] == (f"originals/{original_alt}")
    assert not (mdir / "staging" / "x.json").exists()
    assert _temps(mdir) == []


def test_the_same_bytes_already_there_are_kept_and_their_age_refreshed(tmp_path: Path) -> None:
    """Issue 20 item 6 (refresh of age), SPEC 4: quarantining bytes already quarantined keeps
    the record and the original where they are (no second copy under another name) and makes
    them young again, so that a purge by age does not take what was just decided."""
    mdir = make_memory_dir(tmp_path)
    data = b'{"not": "a staging file"}'
    staging = mdir / "staging" / "x.json"
    staging.write_bytes(data)
    with _opened(mdir) as (mem_fd, staging_fd):
        first = _version(staging_fd, "x.json")
        plan = _quarantine(first, data)
        apply(mem_fd, staging_fd, [plan], announce=lambda _s: None, now=1.0)
        first.close()
    before = _dl(mdir)
    for name in before:
        os.utime(mdir / "deadletter" / name, (_OLD, _OLD))
    staging.write_bytes(data)
    with _opened(mdir) as (mem_fd, staging_fd):
        again = _version(staging_fd, "x.json")
        result = apply(
            mem_fd, staging_fd, [_quarantine(again, data)], announce=lambda _s: None, now=2.0
        ).results["x.json"]
        again.close()
    assert result.status is Status.DONE
    assert result.original == plan.original and result.records == (plan.records[0].name,)
    assert _dl(mdir) == before  # the same names, the same bytes, nothing beside them
    for name in before:
        assert (mdir / "deadletter" / name).stat().st_mtime > _OLD + 1
    assert not staging.exists()


# -- a version that is not what was read ----------------------------------------------------------


def test_a_file_gone_or_changed_before_the_lock_changes_nothing(tmp_path: Path) -> None:
    """Issue 20 item 6 (gone, changed): a version deleted, or replaced by a writer, after it
    was read is handed back as ``gone`` or ``changed``; nothing is written to the dead-letter
    store and the writer's new version stays, untouched, under its name."""
    mdir = make_memory_dir(tmp_path)
    (mdir / "staging" / "gone.json").write_bytes(b"{}")
    (mdir / "staging" / "new.json").write_bytes(b"[]")
    with _opened(mdir) as (mem_fd, staging_fd):
        gone = _version(staging_fd, "gone.json")
        changed = _version(staging_fd, "new.json")
        plans = [_quarantine(gone, b"{}"), _rewrite(changed, b"[1]")]
        (mdir / "staging" / "gone.json").unlink()
        writer = mdir / "staging" / ".writer.tmp"
        writer.write_bytes(b"[2]")
        writer.rename(mdir / "staging" / "new.json")
        heard = _Announcements(mdir / "staging")
        results = apply(mem_fd, staging_fd, plans, announce=heard, now=1.0).results
        gone.close()
        changed.close()
    assert results["gone.json"].status is Status.GONE
    assert results["new.json"].status is Status.CHANGED
    assert heard.settled == []  # nothing to announce: nothing is carried out
    assert _dl(mdir) == {}
    assert (mdir / "staging" / "new.json").read_bytes() == b"[2]"
    assert _temps(mdir) == []


def test_a_writer_version_displaced_by_the_exchange_is_kept_as_a_conflict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 20 item 6 (conflict), SPEC 5: a writer that renames its new version in at the very
    moment between the check and the exchange has it displaced by our rewrite; the transaction
    keeps it as ``<stem>.conflict-<now>-0.json`` (never put back under the name, where a writer
    may rename again), byte-exact, and says so in the result.

    The writer's rename is real; only its timing is forced, by running it inside the real
    ``fsio.exchange`` just before the exchange itself (a race cannot be scheduled otherwise)."""
    mdir = make_memory_dir(tmp_path)
    (mdir / "staging" / "x.json").write_bytes(b"{}")
    real = fsio.exchange

    def writer_first(dir_fd: int, a: str, b: str) -> None:
        (mdir / "staging" / ".writer.tmp").write_bytes(b"writer's newer version")
        (mdir / "staging" / ".writer.tmp").rename(mdir / "staging" / "x.json")
        real(dir_fd, a, b)

    monkeypatch.setattr(fsio, "exchange", writer_first)
    with _opened(mdir) as (mem_fd, staging_fd):
        version = _version(staging_fd, "x.json")
        result = apply(
            mem_fd, staging_fd, [_rewrite(version, b"[]")], announce=lambda _s: None, now=77.0
        ).results["x.json"]
        version.close()
    assert result.status is Status.CONFLICT
    assert result.conflict == "x.conflict-77-0.json"
    assert (mdir / "staging" / "x.conflict-77-0.json").read_bytes() == b"writer's newer version"
    assert _temps(mdir) == []


def test_a_too_large_file_that_can_be_neither_moved_nor_copied_is_left_in_place(
    tmp_path: Path,
) -> None:
    """Issue 20 item 6 (unmovable), SPEC 6: with ``deadletter/`` on another file system (a real
    tmpfs mount) a rename is impossible, and a file larger than ``max_copy`` is not copied: it
    stays in ``staging/`` byte-exact, the result is ``unmovable`` with the reason, and no record
    or original is left in the store."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    mdir = make_memory_dir(tmp_path)
    (mdir / "deadletter").mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mdir / "deadletter")],
        capture_output=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr!r}")
    try:
        data = b"x" * 4096
        (mdir / "staging" / "huge.json").write_bytes(data)
        with _opened(mdir) as (mem_fd, staging_fd):
            version = _version(staging_fd, "huge.json", limit=1024)  # too large to read
            assert version.data is None
            plan = _quarantine(version, None, Action.MOVE)
            result = apply(
                mem_fd, staging_fd, [plan], announce=lambda _s: None, now=1.0, max_copy=1024
            ).results["huge.json"]
            version.close()
        assert result.status is Status.UNMOVABLE
        assert result.reason == "larger than max_quarantine_copy (1024 bytes)"
        assert (mdir / "staging" / "huge.json").read_bytes() == data
        assert _dl(mdir) == {}
        assert _temps(mdir) == []
    finally:
        subprocess.run(["umount", str(mdir / "deadletter")], check=False)


# -- an operator's plans --------------------------------------------------------------------------


def test_a_record_goes_only_with_its_candidate_durable_and_a_changed_one_stays(
    tmp_path: Path,
) -> None:
    """Issue 20 item 6, SPEC 5: a ``CREATE`` writes its staging file under the first free
    ``<base>.recovered-<n>.json`` and only then removes the records it holds; an ``UNLINK``
    whose record changed since it was read removes nothing and says ``changed``; one whose
    record is gone says ``gone``."""
    mdir = make_memory_dir(tmp_path)
    store = mdir / "deadletter"
    store.mkdir()
    for name in ("a.json", "b.json", "c.json"):
        (store / name).write_bytes(name.encode())
    (mdir / "staging" / "s.recovered-1.json").write_bytes(b"taken")

    def held(name: str) -> Held:
        return Held("deadletter", name, Identity.of(os.lstat(store / name)))

    a, b, c = held("a.json"), held("b.json"), held("c.json")
    (store / "b.json").write_bytes(b"quarantined again")
    (store / "c.json").unlink()
    data = _bytes(mdir)
    plans = [
        Plan(key="new", action=Action.CREATE, depends=(a,), removes=(a,), data=data, base="s"),
        Plan(key="changed", action=Action.UNLINK, depends=(b,), removes=(b,)),
        Plan(key="gone", action=Action.UNLINK, depends=(c,), removes=(c,)),
    ]
    heard = _Announcements(mdir / "staging")
    with _opened(mdir) as (mem_fd, staging_fd):
        results = apply(mem_fd, staging_fd, plans, announce=heard, now=1.0).results
    assert results["new"].status is Status.DONE
    assert results["new"].created == "s.recovered-2.json"
    assert results["new"].removed == ("a.json",)
    assert heard.settled == [Settled("new", (), None, "s.recovered-2.json")]
    assert (mdir / "staging" / "s.recovered-2.json").read_bytes() == data
    assert results["changed"].status is Status.CHANGED
    assert results["changed"].stale == {"b.json": "changed"}
    assert results["gone"].status is Status.GONE
    assert sorted(p.name for p in store.iterdir()) == ["b.json"]
    assert (store / "b.json").read_bytes() == b"quarantined again"
    assert _temps(mdir) == []


# -- the caller's own check, between begin and commit --------------------------------------------


def _store_with(mdir: Path, *names: str) -> dict[str, Held]:
    """Records in ``deadletter/``, each as an operator's plan holds it (name and identity)."""
    store = mdir / "deadletter"
    store.mkdir(exist_ok=True)
    for name in names:
        (store / name).write_bytes(name.encode())
    return {n: Held("deadletter", n, Identity.of(os.lstat(store / n))) for n in names}


def _tree(mdir: Path) -> dict[str, bytes]:
    """Every regular file under ``staging/`` and ``deadletter/``, by its path in the memory dir."""
    return {
        str(p.relative_to(mdir)): p.read_bytes()
        for top in ("staging", "deadletter")
        for p in sorted((mdir / top).rglob("*"))
        if p.is_file()
    }


def test_a_plan_the_caller_refuses_between_begin_and_commit_is_refused_and_nothing_of_it_done(
    tmp_path: Path,
) -> None:
    """Issue 20 (callbacks gone but ``announce``): the caller looks at the live plans itself,
    under the lock, between ``begin`` and ``commit``; a ``CREATE`` it refuses is ``REFUSED``
    with its reason, never announced, its staging file never named (no temp left either) and
    the record it would remove still there, byte-exact; the other plan is carried out."""
    mdir = make_memory_dir(tmp_path)
    held = _store_with(mdir, "a.json", "b.json")
    a, b = held["a.json"], held["b.json"]
    plans = [
        Plan(
            key="new", action=Action.CREATE, depends=(a,), removes=(a,), data=_bytes(mdir), base="s"
        ),
        Plan(key="drop", action=Action.UNLINK, depends=(b,), removes=(b,)),
    ]
    heard = _Announcements(mdir / "staging")
    with _opened(mdir) as (mem_fd, staging_fd), begin(mem_fd, staging_fd, plans, now=1.0) as tx:
        assert [p.key for p in tx.live] == ["new", "drop"]
        assert (mdir / CANONICAL_LOCK).exists()  # the caller looks under the lock
        why = "staging/x.json got a candidate of its group while this ran"
        results = tx.commit(announce=heard, refused={"new": why}).results
    assert results["new"].status is Status.REFUSED
    assert results["new"].reason == why
    assert results["new"].created is None and results["new"].removed == ()
    assert results["drop"].status is Status.DONE and results["drop"].removed == ("b.json",)
    assert heard.settled == [Settled("drop")]
    assert _tree(mdir) == {"deadletter/a.json": b"a.json"}
    assert _temps(mdir) == []
    assert not (mdir / CANONICAL_LOCK).exists()


class _CheckFailed(Exception):
    """What a caller's own check raises in the test below."""


@pytest.mark.parametrize("raised", [_CheckFailed, KeyboardInterrupt])
def test_an_exception_between_begin_and_commit_abandons_the_transaction(
    tmp_path: Path, raised: type[BaseException]
) -> None:
    """Issue 20 (callbacks gone but ``announce``): the caller's check raises between ``begin``
    and ``commit``; the exception reaches the caller as it was, nothing is announced, the
    lock is free, and ``staging/`` and ``deadletter/`` are byte for byte as before: the new
    staging file's temp (written before the lock) is removed on an error, and on a Ctrl-C
    left, as a kill would leave it, for the next start's crash recovery, which removes it."""
    mdir = make_memory_dir(tmp_path)
    held = _store_with(mdir, "a.json")
    data = _bytes(mdir)
    (mdir / "staging" / "x.json").write_bytes(b"not json")
    before = _tree(mdir)
    heard = _Announcements(mdir / "staging")
    with _opened(mdir) as (mem_fd, staging_fd):
        version = _version(staging_fd, "x.json")
        plans = [
            _quarantine(version, b"not json"),
            Plan(
                key="new",
                action=Action.CREATE,
                depends=(held["a.json"],),
                removes=(held["a.json"],),
                data=data,
                base="s",
            ),
        ]
        with pytest.raises(raised), begin(mem_fd, staging_fd, plans, now=1.0) as tx:
            assert _temps(mdir), "the premise: the new staging file's temp is written"
            assert [p.key for p in tx.live] == ["new"]
            raise raised()
        version.close()
    assert heard.settled == []
    assert not (mdir / CANONICAL_LOCK).exists()
    if raised is KeyboardInterrupt:
        assert _temps(mdir), "a stop leaves its temps to crash recovery"
        _recover(mdir)
    assert _temps(mdir) == []
    assert _tree(mdir) == before


# -- stale locks, however the transaction ends -------------------------------------------------


def _stale_own_lock(mdir: Path) -> Path:
    """A ``canonical-writer.lock`` in memstaged's own format whose process is gone."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    lock = mdir / CANONICAL_LOCK
    body = {"pid": dead.pid, "started_at": "2026-01-01T00:00:00.000Z", "owner": "memstaged"}
    lock.write_text(json.dumps(body))
    return lock


_REMOVED = "removed (memstaged's own, its process is gone)"


def test_a_stale_lock_removed_before_an_io_error_stopped_the_daemons_transaction_is_logged(
    tmp_path: Path,
) -> None:
    """Issue 20 (stale locks logged in every ending), SPEC 7: the daemon's (and ``--once``'s)
    transaction removes memstaged's own stale ``canonical-writer.lock``, then an I/O error
    stops it (``deadletter`` is a regular file: ENOTDIR under the lock). ``lock_seen`` is
    logged with its fields, the file is deferred and byte-exact in ``staging/``, and nothing
    else changed. The stale lock appears after the pipeline's own look at the lock, when the
    first file's decision is logged, so that only the transaction sees it."""
    mdir = make_memory_dir(tmp_path)
    (mdir / "staging" / "a.json").write_bytes(_bytes(mdir))
    (mdir / "staging" / "b.json").write_bytes(b"not json")
    (mdir / "deadletter").write_bytes(b"a regular file")
    before = _tree(mdir)
    log = RecordingLogger()
    planted: list[Path] = []

    def plant(event: dict[str, object]) -> None:
        if event["event"] == "decision" and not planted:
            planted.append(_stale_own_lock(mdir))

    log.hooks.append(plant)
    pipeline = Pipeline(Options(settle=0), log, durable_log=contextlib.nullcontext)
    memory_dir = memory_dir_of(mdir)
    outcomes = {
        name: outcome
        for batch in pipeline.batches(memory_dir, ["a.json", "b.json"])
        for name, outcome in batch.outcomes.items()
    }
    assert outcomes["a.json"].decision is Decision.VALID
    assert outcomes["b.json"].decision is Decision.DEFERRED
    assert planted and not planted[0].exists()
    seen = log.named("lock_seen")
    assert len(seen) == 1, log.events
    assert seen[0]["lock"] == CANONICAL_LOCK and seen[0]["alive"] is False
    assert seen[0]["action"] == _REMOVED and seen[0]["owner"] == "memstaged"
    assert _tree(mdir) == before
    assert _temps(mdir) == []


def test_a_stale_lock_removed_before_an_io_error_stopped_a_purge_is_logged(
    tmp_path: Path,
) -> None:
    """Issue 20 (stale locks logged in every ending), SPEC 7: ``deadletter purge`` removes
    memstaged's own stale ``canonical-writer.lock`` as it takes the lock; then, once the purge
    is announced, ``deadletter/`` is replaced by a symbolic link (never followed: ELOOP), and
    the transaction stops. The purge says the error, ``lock_seen`` is logged with the memory
    dir, and every record is still there, byte-exact."""
    mdir = make_memory_dir(tmp_path)
    _store_with(mdir, "r1.json", "r2.json")
    lock = _stale_own_lock(mdir)
    aside = mdir / "deadletter.aside"
    log = RecordingLogger()

    def swap(event: dict[str, object]) -> None:
        if event["event"] == "deadletter_purging":
            (mdir / "deadletter").rename(aside)
            (mdir / "deadletter").symlink_to(aside)

    log.hooks.append(swap)
    done = purge(
        memory_dir_of(mdir), cutoff=None, waiter=Waiter(None, lambda _text: None), logger=log
    )
    assert done.error is not None and done.deleted == []
    assert log.named("deadletter_purging"), "the premise: the purge was announced"
    assert not lock.exists()
    seen = log.named("lock_seen")
    assert len(seen) == 1, log.events
    assert seen[0]["action"] == _REMOVED and seen[0]["memory_dir"] == str(memory_dir_of(mdir).path)
    assert sorted(p.name for p in aside.iterdir()) == ["r1.json", "r2.json"]
    assert (aside / "r1.json").read_bytes() == b"r1.json"
    assert not (mdir / CANONICAL_LOCK).exists()


# -- a crash at every point -----------------------------------------------------------------------


def _drive(mdir_text: str, scenario: str) -> None:
    """The child process of the crash test: apply one scenario's plans, then exit 0."""
    mdir = Path(mdir_text)
    with _opened(mdir) as (mem_fd, staging_fd):
        if scenario == "create":
            store = mdir / "deadletter"
            rec = Held("deadletter", "r.json", Identity.of(os.lstat(store / "r.json")))
            data = (mdir / "recovered.bytes").read_bytes()
            plans = [
                Plan(
                    key="new",
                    action=Action.CREATE,
                    depends=(rec,),
                    removes=(rec,),
                    data=data,
                    base="s",
                )
            ]
        elif scenario == "move":
            version = _version(staging_fd, "x.json", limit=8)
            plans = [_quarantine(version, None, Action.MOVE)]
        else:
            version = _version(staging_fd, "x.json")
            assert version.data is not None
            if scenario == "rewrite":
                plans = [_rewrite(version, b"[]\n")]
            else:
                plans = [_quarantine(version, version.data)]
        apply(mem_fd, staging_fd, plans, announce=lambda _s: None, now=1.0)


_STEPS: dict[str, list[str]] = {
    "remove": [
        "lock-taken",
        "temps-synced",
        "batch-written",
        "original-written",
        "record-written",
        "deadletter-synced",
        "renamed-away",
        "removed",
    ],
    "rewrite": [
        "lock-taken",
        "temps-synced",
        "temp-written",
        "batch-written",
        "original-written",
        "deadletter-synced",
        "exchanged",
        "replaced",
        "rewrite-seen",
    ],
    "move": [
        "lock-taken",
        "temps-synced",
        "batch-written",
        "record-written",
        "deadletter-synced",
        "moved",
    ],
    "create": ["lock-taken", "created", "staging-synced", "unlinked", "store-synced"],
}


#: The crash test's child: ``python -c _CHILD <memory dir> <scenario>``.
_CHILD = "import sys, test_transaction as t; t._drive(sys.argv[1], sys.argv[2])"


def _recover(mdir: Path) -> RecordingLogger:
    """What the next memstaged does first: crash recovery of temps (and the stale lock)."""
    log = RecordingLogger()
    mem_fd = fsio.open_dir(str(mdir))
    try:
        temp_recovery.recover_temps(
            mem_fd, temp_recovery.Recovery(log, project_root_of(mdir), False, 1 << 20, now=2.0)
        )
    finally:
        os.close(mem_fd)
    return log


@pytest.mark.parametrize(
    ("scenario", "step"), [(s, step) for s, steps in _STEPS.items() for step in steps]
)
def test_a_transaction_killed_at_any_point_loses_nothing(
    tmp_path: Path, scenario: str, step: str
) -> None:
    """Issue 20 item 6 (crash at every point), SPEC 5 and 6: the child applying a hand-built
    plan is SIGKILLed at ``step`` (which it must reach); after the next start's crash recovery
    every version is still somewhere, byte-exact: in ``staging/`` or in ``originals/`` (a
    quarantine, a move, a rewrite's old bytes), a recovered file's candidate in ``staging/`` or
    its record still in the store; no temp file and no lock is left."""
    mdir = make_memory_dir(tmp_path)
    original = b"x" * 64 if scenario == "move" else _bytes(mdir)
    if scenario == "create":
        (mdir / "deadletter").mkdir()
        (mdir / "deadletter" / "r.json").write_bytes(b"the record")
        (mdir / "recovered.bytes").write_bytes(original)
    else:
        (mdir / "staging" / "x.json").write_bytes(original)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), str(REPO / "tests"), str(REPO)]),
        "MEMSTAGED_CRASH_AT": f"{step}:1",
    }
    child = subprocess.run(
        [PYTHON, "-c", _CHILD, str(mdir), scenario],
        env=env,
        capture_output=True,
        check=False,
        timeout=120,
    )
    assert child.returncode == -signal.SIGKILL, (step, child.returncode, child.stderr)
    _recover(mdir)
    staging = {p.name: p.read_bytes() for p in (mdir / "staging").iterdir()}
    store = _dl(mdir)
    originals = [v for k, v in store.items() if k.startswith("originals/")]
    if scenario == "create":
        assert original in staging.values() or store.get("r.json") == b"the record", (
            staging,
            store,
        )
    elif scenario == "rewrite":
        assert staging.get("x.json") in (original, b"[]\n"), staging
        assert staging["x.json"] == original or original in originals
    else:
        assert staging.get("x.json") == original or original in originals, (staging, store)
        if staging.get("x.json") != original:
            assert [k for k in store if not k.startswith("originals/")], "no record"
    assert _temps(mdir) == []
    assert not (mdir / CANONICAL_LOCK).exists()


def test_the_crash_test_child_completes_without_a_crash_point(tmp_path: Path) -> None:
    """Issue 20 item 6: the crash test's child, run to the end, carries its plan out (so each
    step the crash test names is one it passes through on the way)."""
    mdir = make_memory_dir(tmp_path)
    original = _bytes(mdir)
    (mdir / "staging" / "x.json").write_bytes(original)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), str(REPO / "tests"), str(REPO)]),
    }
    env.pop("MEMSTAGED_CRASH_AT", None)
    child = subprocess.run(
        [PYTHON, "-c", _CHILD, str(mdir), "remove"],
        env=env,
        capture_output=True,
        check=False,
        timeout=120,
    )
    assert child.returncode == 0, child.stderr
    assert list((mdir / "staging").iterdir()) == []
    assert original in _dl(mdir).values()
