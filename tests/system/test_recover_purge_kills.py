"""Issue 19's attack: ``deadletter recover`` and ``purge`` racing the daemon and a writer, with
SIGKILLs of all of them at random moments, and the crash ledger checked after every kill.

Everything is a real process on one memory dir: the daemon (``python -m memstaged``, real
inotify, its decision log in the temp dir, rotated every few dozen KiB), a writer
(``staging_writer.py``: it keeps replacing a pool of staging files by rename, with valid files,
files that get quarantined and files that are not JSON), and ``memstaged deadletter recover
--all`` and ``deadletter purge --yes`` started again and again. A seeded generator picks when
each starts and which one is SIGKILLed when; the dead are restarted. After every kill,
:class:`Ledger` checks on disk and in the log (rotated files included):

* **no candidate lost**: every candidate of every version the writer put in place that it did
  not replace itself (its newest version of each name), and of every version the daemon
  quarantined, is in a file in ``staging/`` or in a record in ``deadletter/`` (a version that is
  not JSON: its bytes in ``staging/`` or ``originals/``), unless a logged
  ``deadletter_purging`` names its record;
* **none duplicated**: no candidate in two staging files, no invalid candidate in ``staging/``;
* **no change unlogged**: every record on disk is named by a logged decision, every recovered
  file by a ``deadletter_recovering`` event, every record or original gone since the last
  check by a ``deadletter_purging``/``deadletter_recovering``/``deadletter_originals_deleting``
  event, and every newest version no longer in ``staging/`` by a ``quarantined`` decision;
* every record's original is there.

At the end a clean recovery leaves every good candidate in exactly one staging file and no
record of it. The seed of a failing run is in the assertion message: rerun it with
``MEMSTAGED_ATTACK_SEED``.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import pytest
from support.decision_log import DecisionLog
from support.helpers import (
    REPO,
    candidate_id,
    memstaged_env,
    record_candidate_id,
    start_daemon,
    start_deadletter,
    write_config,
)
from support.waiting import wait_for

WRITER: Final = REPO / "tests" / "support" / "staging_writer.py"
CATEGORIES: Final = ("lessons", "preferences", "decisions", "domain")
_RECORD: Final = re.compile(
    r"-([0-9a-f]{16})-(?:(lessons|preferences|decisions|domain)-(\d+)|file)(?:\.\d+)?\.json$"
)
#: What a step may SIGKILL; a command that is not running at that moment is left alone.
VICTIMS: Final = ("daemon", "writer", "recover", "purge")


@dataclass
class Version:
    """One version the writer journalled (``staging_writer.py``)."""

    prefix: str
    n: int
    name: str
    kind: str
    sha256: str
    ids: dict[str, list[str]]
    placed: bool = True


@dataclass
class Seen:
    """What the log says, gathered as its events are read."""

    quarantined: set[str] = field(default_factory=set)
    decided: set[str] = field(default_factory=set)
    planned: set[str] = field(default_factory=set)
    final: dict[str, str] = field(default_factory=dict)
    named: set[str] = field(default_factory=set)
    purged: set[str] = field(default_factory=set)
    recovering_files: set[str] = field(default_factory=set)
    recovering_records: set[str] = field(default_factory=set)
    originals_deleted: set[str] = field(default_factory=set)
    #: The last quarantine each killed daemon announced (perhaps never carried out).
    unfinished: set[str] = field(default_factory=set)
    last_quarantine: str | None = None


class Ledger:
    """The crash ledger of the module docstring, checked on disk and in the log."""

    def __init__(self, mdir: Path, log: Path, journal: Path) -> None:
        self.mdir = mdir
        self.staging = mdir / "staging"
        self.dl = mdir / "deadletter"
        self.journal = journal
        self.log = DecisionLog(log, strict=False)
        self.versions: list[Version] = []
        self._journal_at = 0
        self.seen = Seen()
        self._read = 0
        self.records: set[str] = set()
        self.originals: set[str] = set()
        self._original_sha: dict[tuple[str, int, int], str] = {}

    def close(self) -> None:
        self.log.close()

    def update(self) -> None:
        """Read the journal and the log on from where the last look stopped."""
        with self.journal.open("rb") as fh:
            fh.seek(self._journal_at)
            data = fh.read()
        complete = data.rfind(b"\n") + 1
        self._journal_at += complete
        for line in data[:complete].splitlines():
            e = json.loads(line)
            self.versions.append(
                Version(e["prefix"], e["n"], e["name"], e["kind"], e["sha256"], e["ids"])
            )
        self.log.update()
        seen = self.seen
        for event in self.log.events[self._read :]:
            kind = event.get("event")
            if kind == "decision":
                sha = str(event.get("sha256"))
                seen.decided.add(sha)
                if "planned" in event:
                    seen.planned.add(sha)
                seen.final[sha] = str(event.get("decision"))
                if event.get("decision") == "quarantined":
                    seen.quarantined.add(sha)
                    seen.last_quarantine = sha
                seen.named.update(str(d) for d in event.get("deadletter") or ())
            elif kind == "start" and seen.last_quarantine is not None:
                seen.unfinished.add(seen.last_quarantine)
                seen.last_quarantine = None
            elif kind == "deadletter_purging":
                seen.purged.update(event.get("records") or ())
            elif kind == "deadletter_recovering":
                if event.get("staging_file"):
                    seen.recovering_files.add(str(event["staging_file"]))
                seen.recovering_records.update(event.get("records") or ())
                seen.recovering_records.update(event.get("duplicates") or ())
            elif kind == "deadletter_originals_deleting":
                seen.originals_deleted.update(event.get("originals") or ())
        self._read = len(self.log.events)

    def daemon_died(self) -> None:
        """The last quarantine the dead daemon announced may never have been carried out."""
        self.update()
        if self.seen.last_quarantine is not None:
            self.seen.unfinished.add(self.seen.last_quarantine)
            self.seen.last_quarantine = None

    def writer_killed(self) -> None:
        """A killed writer's last journalled version never got its name if its temp still holds
        its bytes (the temp is complete before the version is journalled); the writer's temps
        are its own, removed here before it is restarted."""
        self.update()
        temps = [n for n in os.listdir(self.staging) if n.startswith(".w-") and n.endswith(".tmp")]
        if self.versions:
            last = self.versions[-1]
            tmp = self.staging / f".{last.name}.tmp"
            if tmp.name in temps and hashlib.sha256(tmp.read_bytes()).hexdigest() == last.sha256:
                last.placed = False
        for name in temps:
            (self.staging / name).unlink()

    def _staging(self) -> tuple[Counter[str], set[str], list[str]]:
        """Candidate id -> how many staging files hold it; the sha256 of every staging file;
        the staging files holding an invalid candidate."""
        staged: Counter[str] = Counter()
        shas: set[str] = set()
        invalid: list[str] = []
        for name in os.listdir(self.staging):
            if name.startswith(".") or not name.endswith(".json"):
                continue
            try:
                data = (self.staging / name).read_bytes()
            except FileNotFoundError:
                continue  # the daemon moved it meanwhile: the daemon is dead, so never
            shas.add(hashlib.sha256(data).hexdigest())
            try:
                doc = json.loads(data)
            except ValueError:
                continue
            cands = doc.get("candidates") if isinstance(doc, dict) else None
            for items in cands.values() if isinstance(cands, dict) else ():
                for item in items if isinstance(items, list) else ():
                    cid = candidate_id(item)
                    if cid is None:
                        continue
                    staged[cid] += 1
                    if ".recovered-" in name and item.get("triggers") == [{"type": "bogus"}]:
                        invalid.append(name)
        return staged, shas, invalid

    def _store(self) -> tuple[Counter[str], set[str], set[str], list[str]]:
        """Candidate id -> records holding it; record names; originals' sha256; problems."""
        recorded: Counter[str] = Counter()
        names: set[str] = set()
        problems: list[str] = []
        if self.dl.is_dir():
            for name in os.listdir(self.dl):
                if name.startswith(".") or not name.endswith(".json"):
                    continue
                names.add(name)
                record = json.loads((self.dl / name).read_bytes())
                cid = record_candidate_id(record)
                if cid is not None:
                    recorded[cid] += 1
                original = record.get("memstaged", {}).get("original")
                if original is not None and not (self.dl / original).is_file():
                    problems.append(f"deadletter/{name} lost its original {original}")
        shas: set[str] = set()
        originals = self.dl / "originals"
        present: set[str] = set()
        if originals.is_dir():
            for name in os.listdir(originals):
                if name.startswith("."):
                    continue
                present.add(name)
                st = (originals / name).stat()
                key = (name, st.st_ino, st.st_size)
                if key not in self._original_sha:
                    self._original_sha[key] = hashlib.sha256(
                        (originals / name).read_bytes()
                    ).hexdigest()
                shas.add(self._original_sha[key])
        gone = self.originals - present
        problems += [
            f"originals/{n}: deleted, and no deadletter_originals_deleting names it"
            for n in sorted(gone - self.seen.originals_deleted)
        ]
        self.originals = present
        return recorded, names, shas, problems

    def required(self) -> list[Version]:
        """The versions whose candidates must still be somewhere: each name's newest version
        put in place, and every version the daemon quarantined (but not one whose quarantine
        was announced and then not carried out: a writer got in between, or the daemon was
        killed right after announcing it, and the writer then replaced the file itself)."""
        newest: dict[str, Version] = {}
        for v in self.versions:
            if v.placed:
                newest[v.name] = v
        out = []
        for v in self.versions:
            if not v.placed:
                continue
            exempt = v.sha256 in self.seen.planned or v.sha256 in self.seen.unfinished
            if newest[v.name] is v or (v.sha256 in self.seen.quarantined and not exempt):
                out.append(v)
        return out

    def check(self, *, final: bool = False) -> list[str]:
        """Every problem of the ledger now (see the module docstring)."""
        self.update()
        if not self.versions:
            return []
        last = self.versions[-1]
        tmp = self.staging / f".{last.name}.tmp"
        try:
            pending = hashlib.sha256(tmp.read_bytes()).hexdigest() == last.sha256
        except FileNotFoundError:
            pending = False
        placed, last.placed = last.placed, last.placed and not pending  # stopped before its rename
        # The snapshot is a crash of every process at one instant: the live daemon's last
        # announced quarantine may not be carried out yet either, and the writer may have
        # replaced that file meanwhile (the daemon then logs it deferred, once resumed).
        in_flight = self.seen.last_quarantine
        unfinished = set(self.seen.unfinished)
        if in_flight is not None:
            self.seen.unfinished.add(in_flight)
        try:
            return self._check(final)
        finally:
            last.placed = placed
            self.seen.unfinished = unfinished

    def _check(self, final: bool) -> list[str]:
        staged, staged_shas, invalid = self._staging()
        recorded, records, original_shas, problems = self._store()
        purged = {
            (m[1], m[2] or "file", int(m[3] or 0))
            for m in (_RECORD.search(r) for r in self.seen.purged)
            if m
        }
        newest = {v.name: v for v in self.versions if v.placed}
        for v in self.required():
            where = f"{v.name} v{v.prefix}-{v.n} ({v.kind})"
            if v.kind == "notjson" and (
                v.sha256 not in staged_shas
                and v.sha256 not in original_shas
                and (v.sha256[:16], "file", 0) not in purged
            ):
                problems.append(f"{where}: lost: its bytes are neither in staging/ nor kept")
            for cat in CATEGORIES:
                for i, cid in enumerate(v.ids[cat]):
                    is_purged = (v.sha256[:16], cat, i) in purged
                    if staged[cid] + recorded[cid] == 0 and not is_purged:
                        problems.append(f"{where}: candidate {cid} lost")
                    bad = v.kind == "bad" and cat == "lessons"
                    if (
                        final
                        and not bad
                        and not is_purged
                        and (staged[cid], recorded[cid]) != (1, 0)
                    ):
                        problems.append(
                            f"{where}: {cid} in {staged[cid]} staging file(s) and "
                            f"{recorded[cid]} record(s) after the last recovery"
                        )
            gone = newest[v.name] is v and v.sha256 not in staged_shas
            if gone and v.sha256 not in self.seen.quarantined:
                problems.append(f"{where}: gone from staging/, and no quarantine logged")
        problems += [f"{c}: in {n} staging files" for c, n in sorted(staged.items()) if n > 1]
        problems += [f"staging/{n}: an invalid candidate was recovered" for n in invalid]
        problems += [
            f"deadletter/{n}: written, and named by no logged decision"
            for n in sorted(records)
            if f"deadletter/{n}" not in self.seen.named
        ]
        problems += [
            f"deadletter/{n}: deleted, and no purge or recovery event names it"
            for n in sorted(self.records - records)
            if n not in self.seen.purged and n not in self.seen.recovering_records
        ]
        self.records = records
        recovered = [n for n in os.listdir(self.staging) if ".recovered-" in n]
        problems += [
            f"staging/{n}: recovered, and no deadletter_recovering names it"
            for n in sorted(recovered)
            if not n.startswith(".") and f"staging/{n}" not in self.seen.recovering_files
        ]
        return problems

    def settled(self) -> bool:
        """The daemon has decided every newest version and every recovered file, for good."""
        self.update()
        names = [n for n in os.listdir(self.staging) if not n.startswith(".")]
        for name in names:
            try:
                sha = hashlib.sha256((self.staging / name).read_bytes()).hexdigest()
            except FileNotFoundError:
                return False
            if self.seen.final.get(sha) not in ("valid", "foreign"):
                return False  # undecided, deferred, or quarantined but not yet carried out
        return True


def _stopped(proc: subprocess.Popen[bytes]) -> bool:
    """Is the process stopped by a signal (or already dead), as /proc/<pid>/stat says?"""
    try:
        stat = Path(f"/proc/{proc.pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rpartition(")")[2].split()[0] in ("T", "t", "Z", "X")


class Attack:
    """The daemon, the writer and the commands on one memory dir, each killable."""

    def __init__(self, work: Path, mdir: Path, seed: int) -> None:
        self.work = work
        self.mdir = mdir
        config = write_config(work / "config.toml", log_max_bytes=40_000, log_backups=500)
        self.env = memstaged_env(work, MEMSTAGED_CONFIG=str(config))
        self.logfile = work / "decisions.jsonl"
        self.journal = work / "journal.jsonl"
        self.journal.touch()
        self.ledger = Ledger(mdir, self.logfile, self.journal)
        self.seed = seed
        self.rng = random.Random(seed)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.stderr = work / "stderr"
        self.writers = 0
        self.counts: Counter[str] = Counter()

    def alive(self, what: str) -> bool:
        proc = self.procs.get(what)
        return proc is not None and proc.poll() is None

    def _crash_env(self, most: int) -> dict[str, str]:
        """Half the time, a SIGKILL at the n-th step of any kind (``MEMSTAGED_CRASH_AT``): a
        kill inside a transaction, which a kill at a random moment seldom lands in."""
        env = dict(self.env)
        if self.rng.random() < 0.5:
            env["MEMSTAGED_CRASH_AT"] = f"any:{self.rng.randint(1, most)}"
        return env

    def start_daemon(self, *, crash: bool = True) -> None:
        self.ledger.update()
        before = sum(e.get("event") == "ready" for e in self.ledger.log.events)
        env = self._crash_env(60) if crash else self.env
        self.procs["daemon"] = start_daemon(self.mdir, env, self.stderr)

        def ready() -> bool:
            self.ledger.update()
            if sum(e.get("event") == "ready" for e in self.ledger.log.events) > before:
                return True
            return not self.alive("daemon")  # its crash point came before it was ready

        # Issue 19 item 8: its start-up decides the backlog first; 30 s was too short under load.
        assert wait_for(ready, 600), "the daemon never got ready"

    def start_writer(self) -> None:
        self.writers += 1
        prefix = f"w{self.writers}"
        self.procs["writer"] = subprocess.Popen(
            [
                sys.executable,
                str(WRITER),
                str(self.mdir),
                str(self.journal),
                str(self.rng.randrange(1 << 30)),
                prefix,
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def start_command(self, what: str, *, crash: bool = True) -> None:
        # One that ended since the last look: its exit is checked all the same.
        if what in self.procs and self.reap(what):
            self.check(-1)
        if what == "recover":
            args = ["recover", "--all", "--json", "--wait=20"]
        else:
            age = self.rng.choice(("0s", "1s", "3s"))
            args = ["purge", "--older-than", age, "--yes", "--json", "--wait=20"]
        env = self._crash_env(12) if crash else self.env
        self.procs[what] = start_deadletter(self.mdir, env, *args)

    def reap(self, what: str, *, killed: bool = False) -> bool:
        """A command that ended: by itself (exit 0 or 1, no traceback), or by a SIGKILL, ours
        or its crash point's (then True). Waited for by reading its pipes to the end: a bare
        ``wait()`` first would never return once ``--json`` wrote more than a pipe holds
        (64 KiB: a recovery of a few hundred records), the command blocked in ``write``."""
        proc = self.procs.pop(what)
        _out, err = proc.communicate(timeout=120)
        if killed or proc.returncode == -signal.SIGKILL:
            self.counts[f"killed {what}" if killed else f"crashed {what}"] += 1
            return True
        assert b"Traceback" not in err, err.decode(errors="replace")
        assert proc.returncode in (0, 1), (what, proc.returncode, err.decode(errors="replace"))
        self.counts[f"{what} exit {proc.returncode}"] += 1
        return False

    def kill(self, what: str) -> None:
        proc = self.procs[what]
        proc.kill()
        proc.wait()
        if what == "writer":
            self.ledger.writer_killed()
        elif what == "daemon":
            self.ledger.daemon_died()
        if what in ("recover", "purge"):
            self.reap(what, killed=True)
        else:
            self.counts[f"killed {what}"] += 1

    def check(self, step: int, *, final: bool = False) -> None:
        """The ledger, with every live process stopped (SIGSTOP) while it is read: a snapshot
        of one instant, which the invariant must hold at as it must after any crash (a look
        at staging/ then deadletter/ while a recovery moves a candidate the other way would
        miss it, and a record read before its logged decision would look unlogged)."""
        daemon = self.procs.get("daemon")
        if daemon is not None and daemon.poll() is not None:
            self.ledger.daemon_died()  # its crash point, since the last look
        frozen = [p for p in self.procs.values() if p.poll() is None]
        for proc in frozen:
            proc.send_signal(signal.SIGSTOP)
        try:
            # The signal is delivered asynchronously: a process on the other CPU may still
            # rename a file after kill() returned. Stopped is what /proc says ("T").
            assert wait_for(lambda: all(_stopped(p) for p in frozen), 30), "never stopped"
            problems = self.ledger.check(final=final)
        finally:
            for proc in frozen:
                proc.send_signal(signal.SIGCONT)
        assert not problems, (
            f"seed {self.seed}, step {step}: {len(problems)} problem(s): {problems[:8]}"
        )

    def _crashed(self, n: int) -> None:
        """Check after every process its crash point killed; restart the daemon."""
        for what in ("recover", "purge"):
            if what in self.procs and self.procs[what].poll() is not None and self.reap(what):
                self.check(n)
        daemon = self.procs.get("daemon")
        if daemon is not None and daemon.poll() is not None:
            assert daemon.returncode == -signal.SIGKILL, f"the daemon exited {daemon.returncode}"
            self.counts["crashed daemon"] += 1
            self.ledger.daemon_died()
            self.check(n)
            self.start_daemon()

    def step(self, n: int) -> None:
        self._crashed(n)
        if not self.alive("recover") and self.rng.random() < 0.8:
            self.start_command("recover")
        if not self.alive("purge") and self.rng.random() < 0.35:
            self.start_command("purge")
        time.sleep(self.rng.uniform(0.02, 0.6))  # a random moment for the kill, not a wait
        self._crashed(n)
        victim = self.rng.choice(VICTIMS)
        if self.alive(victim):
            self.kill(victim)
            self.check(n)
        if not self.alive("daemon"):
            self.start_daemon()
        if not self.alive("writer"):
            self.start_writer()

    def finish(self, steps: int) -> None:
        """Stop the writer, let the commands end, recover once more, and check it all."""
        if self.alive("writer"):
            self.kill("writer")
        for what in ("recover", "purge"):
            if what in self.procs and self.reap(what):
                self.check(steps)
        if self.alive("daemon"):
            self.kill("daemon")
        self.start_daemon(crash=False)
        assert wait_for(self.ledger.settled, 60), f"seed {self.seed}: never settled"
        self.check(steps)
        self.start_command("recover", crash=False)
        self.reap("recover")
        assert wait_for(self.ledger.settled, 60), f"seed {self.seed}: never settled"
        self.check(steps + 1, final=True)

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
        self.ledger.close()


#: Read at import: the autouse ``_private_home`` fixture removes every ``MEMSTAGED_*`` variable
#: before any test's own fixture runs, so a fixture reading it always got the default, 19.
_SEED: Final = int(os.environ.get("MEMSTAGED_ATTACK_SEED", "19"))


@pytest.fixture
def attack_seed() -> int:
    return _SEED


def _attack(tmp_path: Path, memory_dir: Path, seed: int, steps: int) -> Counter[str]:
    attack = Attack(tmp_path, memory_dir, seed)
    try:
        attack.start_daemon()
        attack.start_writer()
        for n in range(steps):
            attack.step(n)
        attack.finish(steps)
        assert b"Traceback" not in attack.stderr.read_bytes()
        rotated = list(tmp_path.glob("decisions.jsonl.*"))
        attack.counts["log files"] = len(rotated) + 1
        attack.counts["versions"] = len(attack.ledger.versions)
        print(f"seed {seed}: {dict(attack.counts)}")
        return attack.counts
    finally:
        attack.close()


def test_recover_and_purge_race_the_daemon_and_a_writer_under_kills(
    tmp_path: Path, memory_dir: Path, attack_seed: int
) -> None:
    """Issue 19 (not yet attacked): recover and purge beside the daemon and a writer, each
    SIGKILLed at random moments and restarted; the ledger holds after every kill."""
    counts = _attack(tmp_path, memory_dir, attack_seed, steps=12)
    assert counts["versions"] > 0


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_recover_and_purge_race_at_length(
    tmp_path: Path, memory_dir: Path, attack_seed: int
) -> None:
    """Issue 19, at length: many more kills of the same four processes."""
    counts = _attack(tmp_path, memory_dir, attack_seed, steps=300)
    assert counts["killed daemon"] and counts["killed recover"] and counts["killed purge"]
