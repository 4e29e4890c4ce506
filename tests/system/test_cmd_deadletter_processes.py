"""``memstaged deadletter recover`` and ``purge`` beside other processes: a recovery SIGKILLed
inside its transaction, and the wait for ``canonical-writer.lock`` held by a live reconciler
stand-in (a process of its own).

The commands run in this process, against a store memstaged really wrote, are in
``tests/cli/commands/test_cmd_deadletter.py``."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.commands import (
    deadletter_command,
    original_files,
    record_files,
    record_ids,
    staging_files,
)
from support.helpers import LockHolder, memstaged_cmd, memstaged_env, run_once

from memstaged.cli.commands import _common
from memstaged.deadletter import changes
from memstaged.files import temp_names

pytestmark = pytest.mark.usefixtures("plain_output")


@pytest.mark.parametrize("step", ["lock-taken:1", "created:1", "staging-synced:1", "unlinked:2"])
def test_a_recovery_killed_inside_applys_transaction_loses_and_doubles_nothing(
    store: Path, tmp_path: Path, step: str
) -> None:
    """Issue 12 (one apply path), crash ledger: `recover` SIGKILLed at a step of apply's
    transaction (its temp written, the lock taken; its file renamed in; staging/ fsynced;
    between two record deletions) leaves every record or its candidate in place; a memstaged
    starting then deletes the partial temp, and the next recovery ends with each candidate in
    exactly one staging file and no record of it left."""
    env = memstaged_env(tmp_path, MEMSTAGED_CRASH_AT=step)
    mdir = str(store)
    killed = subprocess.run(
        memstaged_cmd("deadletter", "recover", "--session", "mixed", "--memory-dir", mdir),
        env=env,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert killed.returncode == -9, killed.stderr.decode()
    env.pop("MEMSTAGED_CRASH_AT")
    texts = ["Prefer small commits", "Use msgspec", "Pin the venv"]

    def text(candidate: Any) -> str:
        return str(candidate.get("text") or candidate.get("summary"))

    # Staging files only: a temp (a dot file) is no one's version, and is deleted at next start.
    staged = [json.loads(d) for n, d in staging_files(store).items() if not n.startswith(".")]
    in_staging = [text(c) for d in staged for cs in d["candidates"].values() for c in cs]
    records = [json.loads(d)["candidate"] for d in record_files(store).values()]
    in_records = [text(r["candidate"]) for r in records if "original_staging_file" in r]
    for wanted in texts:  # nothing lost, nothing staged twice, whatever the step
        assert in_staging.count(wanted) + in_records.count(wanted) >= 1, wanted
        assert in_staging.count(wanted) <= 1, wanted
    once = run_once(mdir, env, "--settle", "0", timeout=60)
    assert once.returncode == 0
    assert not [n for n in os.listdir(store / "staging") if n.startswith(temp_names.TEMP_PREFIX)]
    again = subprocess.run(
        memstaged_cmd("deadletter", "recover", "--session", "mixed", "--memory-dir", mdir),
        env=env,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert again.returncode == 1, again.stderr.decode()  # the bad lesson stays
    staged = [json.loads(d) for d in staging_files(store).values()]
    prefs = [c["text"] for d in staged for c in d.get("candidates", {}).get("preferences", [])]
    assert prefs.count("Prefer small commits") == 1
    assert len(record_ids(store, "mixed")) == 1  # only the bad lesson's record


class _Time:
    """The wait's clock and pause: time moves only when the command pauses (never slept)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.now = 0.0
        self.pauses = 0
        self.hook: Any = None
        monkeypatch.setattr(changes, "_monotonic", lambda: self.now)
        monkeypatch.setattr(changes, "_sleep", self.sleep)

    def sleep(self, seconds: float) -> None:
        self.pauses += 1
        self.now += seconds
        if self.hook is not None:
            self.hook(self)


@pytest.fixture
def holder(store: Path) -> Iterator[LockHolder]:
    held = LockHolder(store)
    yield held
    held.kill()


def test_wait_has_a_limit_and_says_what_it_waits_for(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    store: Path,
    holder: LockHolder,
) -> None:
    """Issue 12 item 3: with a live reconciler stand-in holding canonical-writer.lock for good,
    `recover --wait=5` says once what it waits for, gives up when 5 s (of its clock) have passed
    with one clear line, and changes nothing; so does `purge --yes --wait=5`, whose summary says
    the records were not tried rather than "deleted 0"."""
    clock = _Time(monkeypatch)
    before = record_files(store), staging_files(store), original_files(store)
    code, out, err = deadletter_command(capsys, store, "recover", "--all", "--wait=5")
    assert code == 1
    lines = err.splitlines()
    assert lines == [
        f"memstaged: waiting up to 5 s for canonical-writer.lock of {store}, held by pid "
        f"{holder.proc.pid} (owner 'reconciler')",
        f"memstaged: {store}: busy: canonical-writer.lock is held by pid {holder.proc.pid} "
        "(owner 'reconciler') (waited 5 s); nothing more was changed there",
    ]
    assert 5 <= clock.now < 5.1
    assert "3 not tried because 1 memory dir was busy" in out
    assert (record_files(store), staging_files(store), original_files(store)) == before

    later = _common.now() + 31 * 86_400
    monkeypatch.setattr(_common, "now", lambda: later)
    clock.now = 0.0
    code, out, err = deadletter_command(
        capsys, store, "purge", "--older-than", "30d", "--yes", "--wait=5"
    )
    assert code == 1
    assert len(err.splitlines()) == 2
    assert "waiting up to 5 s for canonical-writer.lock" in err
    assert out.splitlines()[-1] == (
        "deleted 0 records and 0 originals; 5 records not tried: the memory dir was busy "
        "(canonical-writer.lock held; see above)"
    )
    assert (record_files(store), staging_files(store), original_files(store)) == before


def test_wait_proceeds_once_the_lock_is_released(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    store: Path,
    holder: LockHolder,
) -> None:
    """Issue 12 item 3: when the reconciler stand-in lets go of canonical-writer.lock while
    `recover --wait` (30 s by default) waits, recovery proceeds at once: the good candidates
    are back in staging/, the message said once what it waited for, and the wait was short."""
    clock = _Time(monkeypatch)

    def release_on_third(time_: _Time) -> None:
        if time_.pauses == 3:
            holder.release()

    clock.hook = release_on_third
    code, out, err = deadletter_command(capsys, store, "recover", "--all", "--wait")
    assert code == 1  # the two records that cannot be recovered stay
    assert err.splitlines() == [
        f"memstaged: waiting up to 30 s for canonical-writer.lock of {store}, held by pid "
        f"{holder.proc.pid} (owner 'reconciler')"
    ]
    assert clock.pauses == 3
    assert "3 recovered, 0 removed as duplicates, 2 left in the dead-letter store" in out
    assert "not tried" not in out
    assert (store / "staging" / "mixed.recovered-1.json").exists()
    assert not (store / "canonical-writer.lock").exists()
