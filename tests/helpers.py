"""Shared helpers of the reliability tests (crash, races, hostile input, fuzz, soak).

* memory dirs in a temp project, and the environment a memstaged subprocess runs in (its own
  config dir and decision log, never the user's; no journald, no systemd notification);
* mixed corpora of staging files whose every candidate carries a unique id, with the decision
  SPEC calls for known in advance (the engine is pure, so the test asks it once);
* :func:`check_final` and :func:`check_interim`: SPEC section 5's invariant, checked on disk.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pytest

from memstaged.ecma import parse_json
from memstaged.errors import NotJSON
from memstaged.fsio import TEMP_PREFIX
from memstaged.pipeline import MemoryDir
from memstaged.project import default_project_root, normalize
from memstaged.quarantine import ORIGINALS_DIR
from memstaged.triage import Context, Decision, Verdict, decide

PYTHON: Final = sys.executable
REPO: Final = Path(__file__).resolve().parent.parent
EVIDENCE: Final = {"discussion_note_ids": [1, 2], "source": "reliability-test"}
#: Staging files are dated well in the past so that no unparseable one is deferred (SPEC 5).
OLD_MTIME: Final = 1_700_000_000
BOM: Final = b"\xef\xbb\xbf"


# -- memory dirs and processes ------------------------------------------------------------------


def make_memory_dir(base: Path, project: str = "example-project") -> Path:
    """``<base>/<project>/.pi/memory/project`` with an empty ``staging/``; returns it."""
    mdir = base / project / ".pi" / "memory" / "project"
    (mdir / "staging").mkdir(parents=True)
    return mdir


def project_root_of(mdir: Path) -> str:
    """The project root memstaged derives for ``mdir`` (SPEC 2.4)."""
    return default_project_root(normalize(os.path.abspath(mdir)))


def memory_dir_of(mdir: Path) -> MemoryDir:
    """``mdir`` as :meth:`Pipeline.process` takes it, with the project root SPEC 2.4 derives."""
    return MemoryDir(os.path.abspath(mdir), project_root_of(mdir))


def context_for(mdir: Path, name: str, *, split: bool = False) -> Context:
    """The :class:`Context` the pipeline builds for ``staging/<name>`` of ``mdir``."""
    absolute = normalize(os.path.abspath(mdir))
    return Context(
        project_root=default_project_root(absolute),
        file_name=name,
        source_path=os.path.join(absolute, "staging", name),
        settled=True,
        split_invalid_candidates=split,
    )


def memstaged_env(work: Path, **extra: str) -> dict[str, str]:
    """The environment of a memstaged subprocess: private config and log, nothing from systemd."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("MEMSTAGED_")
        and k not in ("JOURNAL_STREAM", "INVOCATION_ID", "NOTIFY_SOCKET")
        and not k.startswith("WATCHDOG_")
    }
    (work / "xdg-config").mkdir(parents=True, exist_ok=True)
    env["XDG_CONFIG_HOME"] = str(work / "xdg-config")
    env["XDG_STATE_HOME"] = str(work / "xdg-state")
    env["MEMSTAGED_LOG_FILE"] = str(work / "decisions.jsonl")
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.update(extra)
    return env


def without_dac_override() -> list[str]:
    """The command prefix that makes a run obey file permissions even as root (``setpriv``
    drops the capabilities that let root read anything); skips when that cannot be done."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: cannot make staging/ unreadable")
    return ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]


def reap(proc: subprocess.Popen[bytes]) -> None:
    """Kill a daemon a test left running (a failed assertion before its SIGTERM)."""
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def memstaged_cmd(*args: str) -> list[str]:
    return [PYTHON, "-m", "memstaged", *args]


def write_config(path: Path, **values: object) -> Path:
    """A TOML config file with scalar ``values`` (numbers, booleans, strings)."""
    lines = []
    for key, value in values.items():
        if isinstance(value, bool):
            lines.append(f"{key} = {'true' if value else 'false'}")
        elif isinstance(value, int | float):
            lines.append(f"{key} = {value}")
        else:
            lines.append(f"{key} = {json.dumps(str(value))}")
    path.write_text("\n".join(lines) + "\n")
    return path


def run_once(
    mdir: Path, env: dict[str, str], *args: str, timeout: float = 120
) -> subprocess.CompletedProcess[bytes]:
    """``python -m memstaged --once --memory-dir mdir`` to completion (or SIGKILL by a hook)."""
    return subprocess.run(
        memstaged_cmd("--once", "--memory-dir", str(mdir), *args),
        env=env,
        capture_output=True,
        timeout=timeout,
        check=False,
        cwd=REPO,
    )


@contextlib.contextmanager
def daemon(
    mdirs: Sequence[Path], env: dict[str, str], *args: str, stderr: Path | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """A memstaged daemon on ``mdirs``; stopped with SIGTERM (or SIGKILL) when the block ends."""
    cmd = memstaged_cmd(*args)
    for mdir in mdirs:
        cmd += ["--memory-dir", str(mdir)]
    err_fh = stderr.open("ab") if stderr is not None else None
    proc = subprocess.Popen(
        cmd,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=err_fh if err_fh is not None else subprocess.DEVNULL,
        cwd=REPO,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if err_fh is not None:
            err_fh.close()


def read_events(log: Path) -> list[dict[str, Any]]:
    """Every event of a JSON-lines decision log (a torn last line after a SIGKILL is skipped)."""
    if not log.exists():
        return []
    out = []
    for line in log.read_bytes().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def carried_out(event: dict[str, Any]) -> bool:
    """Is a logged decision's change made? It is logged first (SPEC 5), so until then a
    quarantined or repaired file still holds the bytes the event names."""
    if event.get("decision") not in ("quarantined", "repaired") or event.get("dry_run"):
        return True
    try:
        data = Path(event["path"]).read_bytes()
    except OSError:
        return True  # gone: moved away (or replaced by a writer, which is decided anew)
    return hashlib.sha256(data).hexdigest() != event.get("sha256")


def wait_for(predicate: Any, timeout: float, interval: float = 0.05) -> bool:
    """Poll ``predicate()`` until it is true or ``timeout`` seconds have passed."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def proc_status(pid: int, field: str) -> int:
    """A field of ``/proc/<pid>/status`` (kB or a count): ``VmRSS``, ``VmHWM``, ``Threads``."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@contextlib.contextmanager
def mounted(target: Path, *args: str) -> Iterator[None]:
    """``mount <args> <target>`` for the block; skips the test when mounting is not permitted."""
    target.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", *args, str(target)], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        reason = f"cannot mount ({' '.join(args)}): {done.stderr.strip()}"
        print(reason)
        pytest.skip(reason)
    try:
        yield
    finally:
        if subprocess.run(["umount", str(target)], capture_output=True, check=False).returncode:
            subprocess.run(["umount", "-l", str(target)], capture_output=True, check=False)


# -- corpora --------------------------------------------------------------------------------------


def lesson(cid: str, *, triggers: Any = None) -> dict[str, Any]:
    return {
        "summary": f"{cid} keep the build green",
        "detail": f"{cid}: run the tests before every push.",
        "scope_suggestion": "project",
        "triggers": [{"type": "command", "pattern": "git push"}] if triggers is None else triggers,
        "source_evidence": EVIDENCE,
    }


def preference(cid: str) -> dict[str, Any]:
    return {"text": f"{cid} prefer small commits", "source_evidence": EVIDENCE}


def decision(cid: str) -> dict[str, Any]:
    return {"summary": f"{cid} use msgspec", "detail": f"{cid}: fast", "source_evidence": EVIDENCE}


def doc(session: str, root: str, candidates: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """A staging file; each category absent from ``candidates`` is ``[]`` (contract v2, 2.1)."""
    if isinstance(candidates, dict):
        candidates = {c: [] for c in ("lessons", "preferences", "decisions", "domain")} | candidates
    out: dict[str, Any] = {
        "schemaVersion": 1,
        "session_id": session,
        "project_root": root,
        "produced_at": "2026-11-29T18:04:11.250Z",
        "candidates": candidates,
    }
    out.update(extra)
    return out


def candidate_id(candidate: Any) -> str | None:
    """The unique id a test put at the start of a candidate's ``summary`` or ``text``."""
    if not isinstance(candidate, dict):
        return None
    text = candidate.get("summary", candidate.get("text"))
    if isinstance(text, str) and text.startswith("cid-"):
        return text.split(" ", 1)[0]
    return None


@dataclass(frozen=True)
class Input:
    """One staging file of a corpus: its name, bytes and what it is meant to exercise."""

    name: str
    data: bytes
    kind: str


def _dumps(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False).encode()


KINDS: Final = (
    "valid",
    "valid",
    "r1-empty-triggers",
    "r1-missing-triggers",
    "r2-bom",
    "r3-space",
    "r3-rfc2822",
    "r123",
    "foreign",
    "bad-trigger",
    "bad-version",
    "candidates-array",
    "truncated",
    "non-utf8",
    "nan",
    "empty",
    "utf16",
    "deep",
    "huge-number",
    "lone-surrogate",
    "top-array",
)


def corpus_file(
    rng: random.Random, tag: str, root: str, *, big: int = 0, kinds: Sequence[str] = KINDS
) -> Input:
    """One file of a random kind; every candidate's id starts with ``cid-<tag>-``."""
    ids = iter(f"cid-{tag}-{k}" for k in range(100))
    n = rng.randint(1, 3)
    lessons = [lesson(next(ids)) for _ in range(n)]
    prefs = [preference(next(ids))]
    padding = {"notes": "x" * big} if big else {}
    name = f"s-{tag}.json"
    kind = rng.choice(kinds)
    body = doc(tag, root, {"lessons": lessons, "preferences": prefs}, **padding)
    data: bytes
    if kind == "valid":
        data = _dumps(body)
    elif kind == "r1-empty-triggers":
        lessons[0]["triggers"] = []
        data = _dumps(body)
    elif kind == "r1-missing-triggers":
        del lessons[-1]["triggers"]
        data = _dumps(body)
    elif kind == "r2-bom":
        data = BOM + _dumps(body)
    elif kind == "r3-space":
        body["produced_at"] = "2026-11-29 18:04:11"
        data = _dumps(body)
    elif kind == "r3-rfc2822":
        body["produced_at"] = "Sun, 29 Nov 2026 18:04:11 GMT"
        data = _dumps(body)
    elif kind == "r123":
        lessons[0]["triggers"] = []
        body["produced_at"] = "2026-11-29T18:04:11"
        data = BOM + _dumps(body)
    elif kind == "foreign":
        body["project_root"] = "/somewhere/else"
        body["schemaVersion"] = "broken as well"
        data = _dumps(body)
    elif kind == "bad-trigger":
        lessons[0]["triggers"] = [{"type": "regex", "value": "*.py"}]
        data = _dumps(body)
    elif kind == "bad-version":
        body["schemaVersion"] = "1"
        data = _dumps(body)
    elif kind == "candidates-array":
        body["candidates"] = lessons
        data = _dumps(body)
    elif kind == "truncated":
        full = _dumps(body)
        data = full[: rng.randint(1, len(full) - 1)]
    elif kind == "non-utf8":
        data = _dumps(body).replace(b"keep", b"k\xffp", 1)
    elif kind == "nan":
        data = _dumps(body).replace(b'"schemaVersion": 1', b'"schemaVersion": NaN', 1)
    elif kind == "empty":
        data = b""
    elif kind == "utf16":
        data = json.dumps(body).encode("utf-16")
    elif kind == "deep":
        data = b"[" * 2000 + b"]" * 2000
    elif kind == "huge-number":
        lessons[0]["triggers"] = [{"type": "regex"}]
        data = _dumps(body).replace(b'"schemaVersion": 1', b'"schemaVersion": 1e400', 1)
    elif kind == "lone-surrogate":
        body["schemaVersion"] = 2
        data = json.dumps(body).replace("keep", "\\ud800keep", 1).encode()
    else:  # top-array
        data = _dumps([body])
    return Input(name, data, kind)


def make_corpus(
    rng: random.Random,
    count: int,
    root: str,
    prefix: str,
    *,
    big_every: int = 0,
    kinds: Sequence[str] = KINDS,
) -> list[Input]:
    """``count`` files of mixed kinds; every ``big_every``-th one is padded to ~3 KiB."""
    out = []
    for i in range(count):
        big = 3000 if big_every and i % big_every == big_every - 1 else 0
        out.append(corpus_file(rng, f"{prefix}{i}", root, big=big, kinds=kinds))
    return out


def write_inputs(staging: Path, inputs: Sequence[Input], mtime: int = OLD_MTIME) -> None:
    for item in inputs:
        path = staging / item.name
        path.write_bytes(item.data)
        os.utime(path, (mtime, mtime))


# -- the invariant --------------------------------------------------------------------------------


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def expected_verdict(mdir: Path, item: Input, *, max_size: int | None = None) -> Verdict:
    """The verdict SPEC calls for (``file too large`` above ``max_size``), asked of the engine."""
    from memstaged.triage import decide_too_large

    ctx = context_for(mdir, item.name)
    if max_size is not None and len(item.data) > max_size:
        return decide_too_large(ctx, sha256(item.data), len(item.data), max_size)
    return decide(item.data, ctx)


#: The only part of a record that differs between two quarantines of the same bytes.
_DECIDED_AT: Final = re.compile(rb'"decided_at": ?"[^"]*"')


def temps_in(mdir: Path) -> list[str]:
    """memstaged's temp files anywhere in the memory dir."""
    return sorted(
        str(p.relative_to(mdir)) for p in mdir.rglob("*") if p.name.startswith(TEMP_PREFIX)
    )


def _is_too_large(verdict: Verdict) -> bool:
    return any(r.startswith("file too large") for r in verdict.reasons)


def _kept_original(originals: Path, item: Input, verdict: Verdict) -> str | None:
    """The name under ``originals/`` holding exactly ``item``'s bytes, if one does.

    A file too large to read is moved there unread, named by a hash of its identity (which the
    test cannot know beforehand): any original of its name with its exact bytes is it.
    """
    assert verdict.original is not None
    names = [verdict.original]
    if _is_too_large(verdict) and originals.is_dir():
        prefix = verdict.original[: -len("0123456789abcdef.orig")]
        names = sorted(p.name for p in originals.iterdir() if p.name.startswith(prefix))
    for name in names:
        path = originals / name
        if path.is_file() and not path.is_symlink() and path.read_bytes() == item.data:
            return name
    return None


def check_interim(mdir: Path, inputs: Sequence[Input], verdicts: dict[str, Verdict]) -> list[str]:
    """What must hold at every instant, even right after a SIGKILL and before any restart.

    Every input is in ``staging/`` (as it was, or completely repaired) or byte for byte in
    ``deadletter/originals/``; no ``*.json`` in ``staging/`` is anything else (half-written);
    every file under its final name in ``deadletter/`` is complete.
    """
    problems: list[str] = []
    staging = mdir / "staging"
    originals = mdir / "deadletter" / ORIGINALS_DIR
    for item in inputs:
        verdict = verdicts[item.name]
        path = staging / item.name
        current = path.read_bytes() if path.is_file() else None
        allowed = {item.data}
        if verdict.new_bytes is not None:
            allowed.add(verdict.new_bytes)
        if current is not None and current not in allowed:
            problems.append(f"{item.name}: staging holds bytes that are neither input nor repair")
        in_deadletter = (
            verdict.original is not None and _kept_original(originals, item, verdict) is not None
        )
        if current is None and not in_deadletter:
            problems.append(f"{item.name} ({item.kind}): neither in staging/ nor in deadletter/")
    dl = mdir / "deadletter"
    if dl.is_dir():
        for path in dl.glob("*.json"):
            try:
                parse_json(path.read_bytes())
            except NotJSON:
                problems.append(f"deadletter/{path.name}: incomplete record")
    return problems


def check_logged(mdir: Path, inputs: Sequence[Input], log: Path) -> list[str]:
    """SPEC 5: after any crash, every change memstaged made on disk has its decision in the log.

    An input no longer in ``staging/`` as it was (repaired or removed) has a ``repaired`` or
    ``quarantined`` event for its path; every record in ``deadletter/`` is named by an event.
    """
    rotated = sorted(log.parent.glob(f"{log.name}.[0-9]*"))  # a long run rotates its log
    events = [e for f in [*rotated, log] for e in read_events(f) if e.get("event") == "decision"]
    logged: dict[str, set[str]] = {}
    named: set[str] = set()
    for event in events:
        logged.setdefault(os.path.basename(str(event.get("path", ""))), set()).add(
            str(event.get("decision"))
        )
        named.update(str(d) for d in event.get("deadletter") or ())
    problems: list[str] = []
    staging = mdir / "staging"
    for item in inputs:
        path = staging / item.name
        if path.is_file() and path.read_bytes() == item.data:
            continue
        if not logged.get(item.name, set()) & {"repaired", "quarantined"}:
            problems.append(f"{item.name}: changed on disk, but no repaired/quarantined logged")
    dl = mdir / "deadletter"
    for record in sorted(dl.glob("*.json")) if dl.is_dir() else []:
        if f"deadletter/{record.name}" not in named:
            problems.append(f"deadletter/{record.name}: written, but named by no logged decision")
    return problems


def check_final(
    mdir: Path,
    inputs: Sequence[Input],
    *,
    max_size: int | None = None,
    extra_staging: Sequence[str] = (),
) -> list[str]:
    """SPEC section 5's invariant once memstaged has finished (after any crashes and restarts).

    Valid and foreign files are untouched, repairable ones hold exactly their repair (which is
    valid), malformed ones are gone from ``staging/`` with their bytes in ``originals/`` and
    exactly the records SPEC 4 asks for; nothing else is in ``staging/`` or ``deadletter/``
    (no duplicated record), no temp file is left, and no ``canonical-writer.lock``.
    """
    problems: list[str] = []
    staging = mdir / "staging"
    dl = mdir / "deadletter"
    want_records: dict[str, bytes] = {}
    want_originals: dict[str, bytes] = {}
    loose_records: dict[str, str] = {}
    names = {item.name for item in inputs}
    for item in inputs:
        verdict = expected_verdict(mdir, item, max_size=max_size)
        path = staging / item.name
        current = path.read_bytes() if path.is_file() else None
        if verdict.decision in (Decision.VALID, Decision.FOREIGN):
            if current != item.data:
                problems.append(f"{item.name} ({item.kind}): {verdict.decision} but changed/gone")
        elif verdict.decision is Decision.REPAIRED:
            if current is None or current != verdict.new_bytes:
                problems.append(f"{item.name} ({item.kind}): not exactly its repair")
            elif decide(current, context_for(mdir, item.name)).decision is not Decision.VALID:
                problems.append(f"{item.name}: the repair is not valid")
        elif verdict.decision is Decision.QUARANTINED:
            if current is not None:
                problems.append(f"{item.name} ({item.kind}): quarantined but still in staging/")
        else:
            problems.append(f"{item.name}: unexpected verdict {verdict.decision}")
        if verdict.original is not None and verdict.deadletter and _is_too_large(verdict):
            # Moved unread and named by its identity's hash: found by its bytes, and its one
            # record by that hash, pointing at it.
            kept = _kept_original(dl / ORIGINALS_DIR, item, verdict)
            if kept is None:
                problems.append(f"{item.name}: too large, and not in originals/")
                continue
            want_originals[kept] = item.data
            ident = kept.rsplit(".", 2)[-2]
            record_name = verdict.deadletter[0].name.replace(verdict.sha256[:16], ident)
            want_records[record_name] = b""  # only checked to point at its original
            loose_records[record_name] = kept
        elif verdict.original is not None and verdict.deadletter:
            want_originals[verdict.original] = item.data
            for record in verdict.deadletter:
                want_records[record.name] = record.body
    if staging.is_dir():
        for path in staging.iterdir():
            if path.name not in names and path.name not in extra_staging:
                problems.append(f"staging/{path.name}: unexpected file")
    have_records = {p.name: p for p in dl.glob("*.json")} if dl.is_dir() else {}
    for name, body in want_records.items():
        record_path = have_records.get(name)
        if record_path is None:
            problems.append(f"deadletter/{name}: missing record")
            continue
        got = record_path.read_bytes()
        try:
            parse_json(got)  # as the engine reads JSON (any depth, 1e400, lone surrogates)
        except NotJSON:
            problems.append(f"deadletter/{name}: not JSON")
            continue
        if name in loose_records:
            if json.loads(got)["memstaged"]["original"] != f"{ORIGINALS_DIR}/{loose_records[name]}":
                problems.append(f"deadletter/{name}: does not point at its original")
        elif _DECIDED_AT.sub(b"", got) != _DECIDED_AT.sub(b"", body):
            problems.append(f"deadletter/{name}: record differs from SPEC 4's")
    for name in sorted(set(have_records) - set(want_records)):
        problems.append(f"deadletter/{name}: unexpected (duplicate?) record")
    orig_dir = dl / ORIGINALS_DIR
    have_originals = {p.name for p in orig_dir.iterdir()} if orig_dir.is_dir() else set()
    for name, data in want_originals.items():
        if name not in have_originals:
            problems.append(f"originals/{name}: missing")
        elif (orig_dir / name).read_bytes() != data:
            problems.append(f"originals/{name}: not byte-exact")
    for name in sorted(have_originals - set(want_originals)):
        problems.append(f"originals/{name}: unexpected")
    problems.extend(f"temp file left behind: {t}" for t in temps_in(mdir))
    if (mdir / "canonical-writer.lock").exists():
        problems.append("canonical-writer.lock left behind")
    return problems


# -- inotify ------------------------------------------------------------------------------------

IN_MODIFY: Final = 0x002
IN_ATTRIB: Final = 0x004
IN_CLOSE_WRITE: Final = 0x008
IN_MOVED_FROM: Final = 0x040
IN_MOVED_TO: Final = 0x080
IN_CREATE: Final = 0x100
IN_DELETE: Final = 0x200
IN_Q_OVERFLOW: Final = 0x4000
#: Every event that changes something (opens and reads are left out).
CHANGES: Final = (
    IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE
)


class Inotify:
    """One inotify instance over a few directories: a single queue, so events keep their order.

    :meth:`events` returns ``(directory, name, mask)`` tuples in the order they happened,
    across all watched directories.
    """

    def __init__(self, dirs: Sequence[Path], mask: int = CHANGES) -> None:
        import ctypes

        self._libc = ctypes.CDLL(None, use_errno=True)
        self.fd = self._libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        self.wds: dict[int, str] = {}
        for d in dirs:
            wd = self._libc.inotify_add_watch(self.fd, os.fsencode(d), mask)
            if wd < 0:
                raise OSError(ctypes.get_errno(), f"inotify_add_watch {d}")
            self.wds[wd] = str(d)
        self.log: list[tuple[str, str, int]] = []
        self.overflowed = False

    def poll(self) -> None:
        """Read every queued event into :attr:`log`."""
        import struct

        while True:
            try:
                buf = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                return
            offset = 0
            while offset < len(buf):
                wd, mask, _cookie, length = struct.unpack_from("iIII", buf, offset)
                raw = buf[offset + 16 : offset + 16 + length].rstrip(b"\0")
                offset += 16 + length
                if mask & IN_Q_OVERFLOW:
                    self.overflowed = True
                    continue
                self.log.append((self.wds.get(wd, "?"), os.fsdecode(raw), mask))

    def close(self) -> None:
        os.close(self.fd)
