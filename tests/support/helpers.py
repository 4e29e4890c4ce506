"""Shared helpers of the reliability tests (crash, races, hostile input, fuzz, soak).

* memory dirs in a temp project, and the environment a memstaged subprocess runs in (its own
  config dir and decision log, never the user's; no journald, no systemd notification);
* mixed corpora of staging files whose every candidate carries a unique id, with the decision
  SPEC calls for known in advance (the engine is pure, so the test asks it once);
* :func:`check_final` and :func:`check_interim`: SPEC section 5's invariant, checked on disk,
  and :func:`check_logged`: every change on disk has its decision in the log; the crash
  tests check the last two after every kill with :class:`Invariant`, which reads only what
  changed since its previous check.
"""

from __future__ import annotations

import bisect
import contextlib
import errno
import hashlib
import json
import os
import random
import re
import shutil
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pytest

from memstaged.core.decide import Context, Decision, Verdict, decide
from memstaged.core.foreign import default_project_root, normalize
from memstaged.core.js.ecma import parse_json
from memstaged.core.records import ORIGINALS_DIR
from memstaged.errors import NotJSON
from memstaged.files.memdir import MemoryDir
from memstaged.files.temp_names import TEMP_PREFIX
from support.decision_log import DecisionLog
from support.documents import lesson, malformed, preference, staging_doc

PYTHON: Final = sys.executable
REPO: Final = Path(__file__).resolve().parents[2]
#: The demo's staging files (``make demo``): one of each decision, as the README shows them.
DEMO: Final = REPO / "examples" / "memory-dir" / "staging"
#: Staging files are dated well in the past so that no unparseable one is deferred (SPEC 5).
OLD_MTIME: Final = 1_700_000_000
BOM: Final = b"\xef\xbb\xbf"


# -- memory dirs and processes ------------------------------------------------------------------


def make_memory_dir(base: Path, project: str = "example-project") -> Path:
    """``<base>/<project>/.pi/memory/project`` with an empty ``staging/``; returns it."""
    mdir = base / project / ".pi" / "memory" / "project"
    (mdir / "staging").mkdir(parents=True)
    return mdir


def special_entries(mdir: Path, outside: Path) -> dict[str, str]:
    """Create in ``staging/`` every kind of entry SPEC 6 says is never touched (links to a file
    outside, to a directory, dangling, a loop; a FIFO, a socket, a directory named ``*.json``);
    name -> the reason a ``skipped`` decision gives."""
    staging = mdir / "staging"
    target = outside / "outside.json"
    target.write_bytes(malformed(project_root_of(mdir)))
    (outside / "dir").mkdir()
    os.symlink(target, staging / "link-outside.json")
    os.symlink(outside / "dir", staging / "link-dir.json")
    os.symlink(outside / "missing.json", staging / "link-dangling.json")
    os.symlink("loop-b.json", staging / "loop-a.json")
    os.symlink("loop-a.json", staging / "loop-b.json")
    os.mkfifo(staging / "fifo.json")
    os.mknod(staging / "socket.json", stat.S_IFSOCK | 0o600)
    (staging / "directory.json").mkdir()
    return {
        "link-outside.json": "symbolic link",
        "link-dir.json": "symbolic link",
        "link-dangling.json": "symbolic link",
        "loop-a.json": "symbolic link",
        "loop-b.json": "symbolic link",
        "fifo.json": "not a regular file",
        "socket.json": "not a regular file",
        "directory.json": "a directory",
    }


def deadletter_records(mdir: Path) -> list[dict[str, Any]]:
    """Every dead-letter record of ``mdir``, parsed (by ``parse_json``, not ``json.loads``: a
    record of a 10^6-deep file is that deep too), in name order."""
    return [parse_json(p.read_bytes()).value for p in sorted((mdir / "deadletter").glob("*.json"))]


def project_root_of(mdir: Path) -> str:
    """The project root memstaged derives for ``mdir``: its physical path (SPEC 2.4)."""
    return os.path.realpath(default_project_root(normalize(os.path.abspath(mdir))))


def memory_dir_of(mdir: Path) -> MemoryDir:
    """``mdir`` as :meth:`Pipeline.process` takes it, with the project root SPEC 2.4 derives."""
    return MemoryDir(os.path.abspath(mdir), project_root_of(mdir))


def context_for(mdir: Path, name: str, *, split: bool = False) -> Context:
    """The :class:`Context` the pipeline builds for ``staging/<name>`` of ``mdir``."""
    absolute = normalize(os.path.abspath(mdir))
    return Context(
        project_root=project_root_of(mdir),
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
    mdir: Path | str,
    env: dict[str, str],
    *args: str,
    timeout: float = 120,
    prefix: Sequence[str] = (),
) -> subprocess.CompletedProcess[bytes]:
    """``python -m memstaged --once --memory-dir mdir ARGS`` to completion (or SIGKILL by a hook),
    its output captured: the tests' one way to run ``--once`` as a process of its own. ``mdir``
    may be a glob; ``prefix`` is a command it runs under (``setpriv``, to obey permissions)."""
    return subprocess.run(
        [*prefix, *memstaged_cmd("--once", "--memory-dir", str(mdir), *args)],
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


def files_under(root: Path) -> dict[str, bytes]:
    """Every regular file under ``root`` (no link, not the reconciler's lock): path -> bytes."""
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.is_symlink() and p.name != ".memstaged.lock"
    }


def proc_status(pid: int, field: str) -> int:
    """A field of ``/proc/<pid>/status`` (kB or a count): ``VmRSS``, ``VmHWM``, ``Threads``."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def stopped(pid: int) -> bool:
    """Whether ``pid`` is stopped (state ``T`` in /proc/<pid>/stat)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] == "T"


def once_stopped_at(
    mdir: Path, env: dict[str, str], step: str, *, stderr: int = subprocess.PIPE
) -> subprocess.Popen[bytes]:
    """``memstaged --once`` on ``mdir`` in a real process, stopped (SIGSTOP, by the crash hook
    ``MEMSTAGED_CRASH_AT``) as it reaches ``step`` (``<step>:<n>``); the caller continues it
    (SIGCONT) or kills it."""
    from support.waiting import wait_for

    proc = subprocess.Popen(
        memstaged_cmd("--once", "--memory-dir", str(mdir)),
        env={**env, "MEMSTAGED_CRASH_AT": f"{step}:STOP"},
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=stderr,
    )
    try:
        assert wait_for(lambda: stopped(proc.pid) or proc.poll() is not None, 120)
        assert proc.poll() is None, proc.communicate()
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    return proc


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


def candidate_id(candidate: Any) -> str | None:
    """The unique id a test put at the start of a candidate's ``summary`` or ``text``."""
    if not isinstance(candidate, dict):
        return None
    text = candidate.get("summary", candidate.get("text"))
    if isinstance(text, str) and text.startswith("cid-"):
        return text.split(" ", 1)[0]
    return None


def record_candidate_id(record: Any) -> str | None:
    """The test's id of the candidate a dead-letter record holds (an R6 record wraps it)."""
    cand = record.get("candidate") if isinstance(record, dict) else None
    if isinstance(cand, dict) and "original_staging_file" in cand:
        cand = cand["candidate"]
    return candidate_id(cand)


def start_daemon(mdir: Path, env: dict[str, str], stderr: Path) -> subprocess.Popen[bytes]:
    """A daemon on ``mdir`` (settle 0.3 s), its output appended to ``stderr``; not waited for:
    the kill harnesses wait for its ``ready`` in their own log reading, and kill it at will."""
    with stderr.open("ab") as err:
        return subprocess.Popen(
            memstaged_cmd("--memory-dir", str(mdir), "--settle", "0.3"),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=err,
            stderr=err,
        )


def start_deadletter(mdir: Path, env: dict[str, str], *args: str) -> subprocess.Popen[bytes]:
    """``memstaged deadletter ARGS --memory-dir MDIR``, started, its output on pipes: read them
    to the end (``communicate``) before its exit, as ``--json`` may write more than a pipe holds."""
    return subprocess.Popen(
        memstaged_cmd("deadletter", *args, "--memory-dir", str(mdir)),
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


_HOLD_INSTANCE_LOCK: Final = """
import sys
from pathlib import Path
from memstaged.files.locks import InstanceLock
lock = InstanceLock(sys.argv[1], state_dir=Path(sys.argv[2]))
lock.acquire(wait=False)
print("held", flush=True)
sys.stdin.readline()
"""


@contextlib.contextmanager
def instance_lock_held(
    mdir: Path, state_dir: Path, scripts: Path, *role: str
) -> Iterator[subprocess.Popen[str]]:
    """A process holding the instance lock of ``mdir`` (in ``state_dir``) as memstaged holds
    it, until the block ends. Its command line is memstaged's (a script named ``memstaged``,
    in ``scripts``, run by the interpreter, as an installed one is), so it is named as one: a
    daemon, or with ``role`` ``"--once"`` a ``--once`` run."""
    scripts.mkdir(parents=True, exist_ok=True)
    script = scripts / "memstaged"
    script.write_text(_HOLD_INSTANCE_LOCK)
    with holding([PYTHON, str(script), str(mdir), str(state_dir), *role]) as proc:
        yield proc


@contextlib.contextmanager
def holding(cmd: Sequence[str]) -> Iterator[subprocess.Popen[str]]:
    """``cmd`` started, once it printed ``held`` (it has taken what it holds), and killed when
    the block ends."""
    proc = subprocess.Popen(list(cmd), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        assert proc.stdout.readline().strip() == "held"
        yield proc
    finally:
        proc.kill()
        proc.wait()
        proc.stdin.close()
        proc.stdout.close()


_HOLD_RECONCILER_LOCK: Final = r"""
import json, os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
os.write(fd, json.dumps({"pid": os.getpid(), "owner": "reconciler"}).encode())
os.close(fd)
print("held", flush=True)
sys.stdin.readline()
os.unlink(sys.argv[1])
print("released", flush=True)
"""


class LockHolder:
    """A reconciler stand-in: a live process holding canonical-writer.lock until told to let go."""

    def __init__(self, memory_dir: Path) -> None:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                _HOLD_RECONCILER_LOCK,
                str(memory_dir / "canonical-writer.lock"),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline() == "held\n"

    def release(self) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline() == "released\n"
        self.proc.wait(timeout=10)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()


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
    body = staging_doc(root, tag, candidates={"lessons": lessons, "preferences": prefs}, **padding)
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
    from memstaged.core.decide import decide_too_large

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


def _kept_original(
    originals: Path, item: Input, verdict: Verdict, listing: Sequence[str] | None = None
) -> str | None:
    """The name under ``originals/`` holding exactly ``item``'s bytes, if one does.

    A file too large to read is moved there unread, named by a hash of its identity (which the
    test cannot know beforehand): any original of its name with its exact bytes is it. Those are
    looked up in ``listing`` (the sorted names of ``originals/``, listed once by the caller:
    listing the directory once per file made checking 5,000 files take 40 s).
    """
    assert verdict.original is not None
    names = [verdict.original]
    if _is_too_large(verdict) and originals.is_dir():
        if listing is None:
            listing = sorted(os.listdir(originals))
        names = _starting_with(listing, verdict.original[: -len("0123456789abcdef.orig")])
    for name in names:
        path = originals / name
        if path.is_file() and not path.is_symlink() and path.read_bytes() == item.data:
            return name
    return None


def _starting_with(listing: Sequence[str], prefix: str) -> list[str]:
    """The names of the sorted ``listing`` that start with ``prefix``, found by bisection."""
    at = bisect.bisect_left(listing, prefix)
    out = []
    while at < len(listing) and listing[at].startswith(prefix):
        out.append(listing[at])
        at += 1
    return out


#: What tells one version of a file from another without reading it: device, inode, size,
#: mtime and ctime. A writer can set the mtime back and keep the size, but any write, rename or
#: ``chmod`` sets the ctime to now (SPEC 5 identifies a version the same way).
FileKey = tuple[int, int, int, int, int]


def file_key(st: os.stat_result) -> FileKey:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _stat(path: str, *, follow: bool) -> os.stat_result | None:
    """``path``'s status when it is a regular file (through a link if ``follow``), else None."""
    try:
        st = os.stat(path, follow_symlinks=follow)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return st if stat.S_ISREG(st.st_mode) else None


def _read_version(path: str, *, follow: bool) -> tuple[FileKey, bytes] | None:
    """A regular file's bytes and the key of the very version read (its descriptor's ``fstat``,
    taken before reading: a write after it changes the ctime, so the next look re-reads)."""
    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as err:
        if err.errno == errno.ELOOP:  # a link, not followed
            return None
        raise
    with open(fd, "rb") as fh:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        return file_key(st), fh.read()


@dataclass
class _Expected:
    item: Input
    verdict: Verdict | None


class Invariant:
    """:func:`check_interim` and :func:`check_logged` after every kill, reading only what changed.

    After each kill every input and every dead-letter record is looked at again, but a file
    whose :data:`FileKey` is the one it had at the last check is not read again: its bytes are
    the ones judged then (a file written, renamed, replaced or touched has a new ctime). The
    log is read by a :class:`DecisionLog`, one new line at a time. So a check costs a ``stat``
    per input and per record, plus reading what the last run changed, not the whole memory dir
    and the whole log again (which made 150 kills of a run over thousands of files take hours).
    """

    def __init__(self, mdir: Path, log: Path | None = None) -> None:
        self.mdir = mdir
        self._staging = os.path.join(mdir, "staging")
        self._deadletter = os.path.join(mdir, "deadletter")
        self._originals = os.path.join(self._deadletter, ORIGINALS_DIR)
        self._log = DecisionLog(log, strict=False, keep_events=False) if log is not None else None
        self._inputs: dict[str, _Expected] = {}
        #: staging name -> (key, holds the input's bytes, holds its repair's bytes)
        self._seen_staging: dict[str, tuple[FileKey, bool, bool]] = {}
        #: (original's name, input's name) -> (key, holds exactly the input's bytes)
        self._seen_originals: dict[tuple[str, str], tuple[FileKey, bool]] = {}
        #: record name -> (key, parses as JSON)
        self._seen_records: dict[str, tuple[FileKey, bool]] = {}

    def __enter__(self) -> Invariant:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._log is not None:
            self._log.close()

    def add(self, inputs: Sequence[Input], verdicts: Mapping[str, Verdict] | None = None) -> None:
        """Inputs to check from now on, with the verdicts :func:`expected_verdict` gives them
        (needed by :meth:`interim` only)."""
        for item in inputs:
            verdict = verdicts[item.name] if verdicts is not None else None
            self._inputs[item.name] = _Expected(item, verdict)

    def check(self) -> list[str]:
        """:meth:`interim` and :meth:`logged`."""
        return self.interim() + self.logged()

    def _in_staging(self, expected: _Expected) -> tuple[bool, bool, bool]:
        """(present, holds the input's bytes, holds its repair's bytes) of ``staging/<name>``."""
        name = expected.item.name
        path = os.path.join(self._staging, name)
        st = _stat(path, follow=True)
        if st is None:
            self._seen_staging.pop(name, None)
            return False, False, False
        seen = self._seen_staging.get(name)
        if seen is None or seen[0] != file_key(st):
            version = _read_version(path, follow=True)
            if version is None:
                self._seen_staging.pop(name, None)
                return False, False, False
            key, data = version
            repair = expected.verdict.new_bytes if expected.verdict is not None else None
            seen = self._seen_staging[name] = (key, data == expected.item.data, data == repair)
        return True, seen[1], seen[2]

    def _kept(self, expected: _Expected, listing: Sequence[str]) -> bool:
        """Is the input byte for byte under ``originals/`` (see :func:`_kept_original`)?"""
        verdict = expected.verdict
        assert verdict is not None
        if verdict.original is None:
            return False
        names = [verdict.original]
        if _is_too_large(verdict):
            names = _starting_with(listing, verdict.original[: -len("0123456789abcdef.orig")])
        for name in names:
            path = os.path.join(self._originals, name)
            cache = (name, expected.item.name)
            st = _stat(path, follow=False)
            if st is None:
                self._seen_originals.pop(cache, None)
                continue
            seen = self._seen_originals.get(cache)
            if seen is None or seen[0] != file_key(st):
                version = _read_version(path, follow=False)
                if version is None:
                    continue
                seen = self._seen_originals[cache] = (version[0], version[1] == expected.item.data)
            if seen[1]:
                return True
        return False

    def _records(self) -> list[str]:
        """The names of ``deadletter/*.json`` (as ``Path.glob`` matches them: any entry)."""
        try:
            return sorted(n for n in os.listdir(self._deadletter) if n.endswith(".json"))
        except (FileNotFoundError, NotADirectoryError):
            return []

    def interim(self) -> list[str]:
        """What must hold at every instant, even right after a SIGKILL and before any restart.

        Every input is in ``staging/`` (as it was, or completely repaired) or byte for byte in
        ``deadletter/originals/``; no input's name in ``staging/`` holds anything else
        (half-written); every file under its final name in ``deadletter/`` is complete.
        """
        problems: list[str] = []
        try:
            listing = sorted(os.listdir(self._originals))
        except (FileNotFoundError, NotADirectoryError):
            listing = []
        for expected in self._inputs.values():
            item = expected.item
            present, as_input, as_repair = self._in_staging(expected)
            if present and not (as_input or as_repair):
                problems.append(
                    f"{item.name}: staging holds bytes that are neither input nor repair"
                )
            if not present and not self._kept(expected, listing):
                problems.append(
                    f"{item.name} ({item.kind}): neither in staging/ nor in deadletter/"
                )
        seen_records: dict[str, tuple[FileKey, bool]] = {}
        for name in self._records():
            path = os.path.join(self._deadletter, name)
            st = _stat(path, follow=True)
            if st is None:
                problems.append(f"deadletter/{name}: not a regular file")
                continue
            seen = self._seen_records.get(name)
            if seen is None or seen[0] != file_key(st):
                version = _read_version(path, follow=True)
                if version is None:
                    problems.append(f"deadletter/{name}: not a regular file")
                    continue
                try:
                    parse_json(version[1])
                    seen = (version[0], True)
                except NotJSON:
                    seen = (version[0], False)
            seen_records[name] = seen
            if not seen[1]:
                problems.append(f"deadletter/{name}: incomplete record")
        self._seen_records = seen_records
        return problems

    def logged(self) -> list[str]:
        """SPEC 5: after any crash, every change memstaged made on disk has its decision in
        the log.

        An input no longer in ``staging/`` as it was (repaired or removed) has a ``repaired``
        or ``quarantined`` event for its path; every record in ``deadletter/`` is named by an
        event (of the log or of its rotated files).
        """
        assert self._log is not None, "no decision log to check"
        self._log.update()
        problems: list[str] = []
        for expected in self._inputs.values():
            name = expected.item.name
            _present, as_input, _as_repair = self._in_staging(expected)
            if as_input:
                continue
            if not self._log.logged.get(name, set()) & {"repaired", "quarantined"}:
                problems.append(f"{name}: changed on disk, but no repaired/quarantined logged")
        for name in self._records():
            if f"deadletter/{name}" not in self._log.named:
                problems.append(f"deadletter/{name}: written, but named by no logged decision")
        return problems


def check_interim(mdir: Path, inputs: Sequence[Input], verdicts: dict[str, Verdict]) -> list[str]:
    """:meth:`Invariant.interim`, checked once (reading everything)."""
    with Invariant(mdir) as invariant:
        invariant.add(inputs, verdicts)
        return invariant.interim()


def check_logged(mdir: Path, inputs: Sequence[Input], log: Path) -> list[str]:
    """:meth:`Invariant.logged`, checked once (reading the whole log, rotated files included)."""
    with Invariant(mdir, log) as invariant:
        invariant.add(inputs)
        return invariant.logged()


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
    originals_listing: list[str] | None = None  # listed once, when first needed
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
            if originals_listing is None:
                orig_dir = dl / ORIGINALS_DIR
                originals_listing = sorted(os.listdir(orig_dir)) if orig_dir.is_dir() else []
            kept = _kept_original(dl / ORIGINALS_DIR, item, verdict, originals_listing)
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
IN_OPEN: Final = 0x020
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


def same_size_doc(root: str, tag: str, *, repairable: bool = True) -> bytes:
    """A malformed or repairable (no triggers) staging file of 700 bytes, told apart by ``tag``:
    what writers that keep size and mtime write (``cp -p``, ``rsync -t``)."""
    body = {
        "schemaVersion": 1,
        "session_id": f"w-{tag}",
        "project_root": root,
        "produced_at": "2026-11-29T18:04:11.250Z",
        "candidates": {
            "lessons": [
                {
                    "summary": f"cid-{tag} keep it",
                    "detail": "d",
                    "scope_suggestion": "project",
                    "source_evidence": {"discussion_note_ids": [1]},
                }
            ],
            "preferences": [],
            "decisions": [],
            "domain": [],
        },
    }
    text = json.dumps(body)
    if not repairable:
        text = text[:-1]  # unparseable: quarantined once settled
    return text.encode().ljust(700)
