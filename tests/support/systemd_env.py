"""A real ``systemd --user`` manager and a real journald, private to one test.

Usage::

    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    with user_systemd() as sd:
        sd.install_unit("foo.service", UNIT_TEXT)   # writes + daemon-reload
        sd.systemctl("start", "foo.service", check=True)
        sd.journalctl("--user-unit", "foo.service", "FIELD=value", "-o", "json")

How it works (see docs/systemd-testing.md for the why of every step):

* A private mount namespace (``unshare --mount``) gets its own ``/run/systemd`` and
  ``/run/log`` (bind mounts of directories under a temp dir), so nothing on the host is
  touched: the host's ``/run/systemd/system`` (which makes ``sd_booted()`` true and would
  make apt's maintainer scripts call ``systemctl``) and ``/run/systemd/journal`` are left
  alone. ``/var/log/journal`` is hidden behind an empty directory.
* ``systemd-journald`` runs in that namespace (volatile storage, no rate limit, no kmsg)
  and is the namespace's anchor: every other command enters it with ``nsenter``.
* ``systemd --user`` runs in that namespace, with private ``HOME``/``XDG_*``, inside a
  fresh cgroup ``/<name>.slice/user@<uid>.service`` so that journald derives
  ``_SYSTEMD_USER_UNIT=`` for its services, and so that teardown can prove (via
  ``cgroup.events``) that no service process is left behind.
* Readiness is the real ``sd_notify`` protocol: both daemons get a ``NOTIFY_SOCKET`` of
  ours and we wait for their ``READY=1``; then ``systemctl --user is-system-running --wait``.
* ``user_systemd(uid=N)`` runs the manager as an unprivileged user instead (as ``user@N.service``
  would: that uid, no capabilities, a delegated cgroup): what a normal user's manager can and
  cannot enforce differs from root's. :func:`unprivileged_uid` picks one (``nobody``).

Only the standard library is used, so this module works before memstaged is installed.
"""

from __future__ import annotations

import contextlib
import functools
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from support.waiting import wait_until

__all__ = [
    "LeftoverProcessesError",
    "StartupError",
    "UserSystemd",
    "unavailable_reason",
    "unprivileged_uid",
    "user_systemd",
    "wait_until",
]

SYSTEMD_CANDIDATES = ("/lib/systemd/systemd", "/usr/lib/systemd/systemd")
JOURNALD_CANDIDATES = ("/lib/systemd/systemd-journald", "/usr/lib/systemd/systemd-journald")
REQUIRED_TOOLS = ("systemctl", "journalctl", "unshare", "nsenter", "mount", "sh")

# AF_UNIX socket paths are limited to 108 bytes; the manager binds
# $XDG_RUNTIME_DIR/systemd/private etc., so the base directory must be short.
_BASE_PARENT = "/tmp"
_MAX_BASE_LEN = 40

_JOURNALD_CONF = """\
[Journal]
Storage=volatile
RateLimitIntervalSec=0
ReadKMsg=no
ForwardToSyslog=no
ForwardToKMsg=no
ForwardToConsole=no
ForwardToWall=no
RuntimeMaxUse=64M
"""

# Fail fast instead of systemd's 90 s when a test service hangs on start or stop.
_USER_CONF = """\
[Manager]
DefaultTimeoutStartSec=15s
DefaultTimeoutStopSec=15s
"""

_UNSHARE = ("unshare", "--mount", "--propagation=private", "--")

# Run inside the fresh mount namespace, as root: $1 = base dir, $2 = journald binary.
_NAMESPACE_SCRIPT = """\
set -e
mkdir -p /run/systemd /run/log
mount --no-mtab --bind "$1/run" /run/systemd
mount --no-mtab --bind "$1/log" /run/log
if [ -d /var/log/journal ]; then mount --no-mtab --bind "$1/empty" /var/log/journal; fi
mkdir -p /run/user
mount --no-mtab --bind "$1/run-user" /run/user
exec "$2"
"""

# Run inside the namespace: $1 = cgroup dir, $2 = systemd binary, $3 = the uid to run as (empty:
# stay root). Moving the shell into the cgroup before exec puts the manager there from its first
# instruction on. setpriv does what PID 1 does for user@N.service: that uid and gid, no
# supplementary groups, no capabilities left (the bounding set stays full, as it does there).
_MANAGER_SCRIPT = """\
set -e
echo $$ > "$1/cgroup.procs"
if [ -n "$3" ]; then
    exec setpriv --reuid="$3" --regid="$3" --clear-groups -- "$2" --user --log-target=journal
fi
exec "$2" --user --log-target=journal
"""


class StartupError(RuntimeError):
    """journald or the user manager did not come up."""


class LeftoverProcessesError(RuntimeError):
    """Processes survived teardown (they have been killed since), or cgroups stayed."""


# --------------------------------------------------------------------------- discovery


def _first_existing(candidates: tuple[str, ...]) -> str | None:
    return next((c for c in candidates if Path(c).is_file()), None)


@dataclass(frozen=True)
class _Cgroups:
    tracking: Path  # the cgroup2 mount systemd tracks processes in
    mirror: Path | None  # hybrid mode: the name=systemd v1 tree systemd mirrors into


def _cgroups() -> _Cgroups | None:
    """Where systemd will track processes, decided the way systemd 252 decides it."""
    cgroup2: set[str] = set()
    name_systemd: set[str] = set()
    with Path("/proc/self/mountinfo").open(encoding="utf-8") as f:
        for line in f:
            pre, _, post = line.partition(" - ")
            mountpoint = pre.split()[4]
            fstype, _source, superopts = post.split()[:3]
            if fstype == "cgroup2":
                cgroup2.add(mountpoint)
            elif fstype == "cgroup" and "name=systemd" in superopts.split(","):
                name_systemd.add(mountpoint)
    if "/sys/fs/cgroup" in cgroup2:
        return _Cgroups(Path("/sys/fs/cgroup"), None)
    if "/sys/fs/cgroup/unified" in cgroup2:
        mirror = "/sys/fs/cgroup/systemd"  # hybrid: systemd mirrors its tree into name=systemd
        has_mirror = mirror in name_systemd
        return _Cgroups(Path("/sys/fs/cgroup/unified"), Path(mirror) if has_mirror else None)
    return None


@functools.cache
def unavailable_reason() -> str | None:
    """One line saying why a user manager cannot run here, or None if it can."""
    if not sys.platform.startswith("linux"):
        return f"systemd needs Linux, this is {sys.platform}"
    if os.geteuid() != 0:
        return "needs root (private mount namespace, bind mounts, a new cgroup)"
    if _first_existing(SYSTEMD_CANDIDATES) is None:
        return "no systemd binary (/lib/systemd/systemd): apt-get install systemd"
    if _first_existing(JOURNALD_CANDIDATES) is None:
        return "no systemd-journald binary: apt-get install systemd"
    missing = [tool for tool in REQUIRED_TOOLS if shutil.which(tool) is None]
    if missing:
        return f"missing tools: {', '.join(missing)}"
    cgroups = _cgroups()
    if cgroups is None:
        return "no cgroup2 hierarchy at /sys/fs/cgroup or /sys/fs/cgroup/unified"
    if not os.access(cgroups.tracking, os.W_OK):
        return f"cgroup hierarchy {cgroups.tracking} is not writable"
    probe = subprocess.run(
        [*_UNSHARE, "true"],
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.returncode != 0:
        return f"cannot create a mount namespace: {probe.stderr.strip() or probe.returncode}"
    return None


def unprivileged_uid() -> int | None:
    """A uid to run an unprivileged user manager as (``nobody``), or None if there is none."""
    if shutil.which("setpriv") is None:
        return None
    try:
        return pwd.getpwnam("nobody").pw_uid
    except KeyError:
        return None


# --------------------------------------------------------------------------- the handle


@dataclass(frozen=True)
class UserSystemd:
    """A running journald + ``systemd --user`` pair in a private mount namespace."""

    base: Path  # everything lives under here; removed at teardown
    env: dict[str, str]  # HOME, XDG_*, ... as the manager (and its services) see them
    unit_dir: Path  # $XDG_CONFIG_HOME/systemd/user
    journal_dir: Path  # journald's files: journalctl -D / systemd.journal.Reader(path=)
    cgroup: Path  # the manager's cgroup (the user@<uid>.service of this instance)
    journald_pid: int
    manager_pid: int
    uid: int  # the manager's uid; commands run as it (journalctl excepted)

    @property
    def home(self) -> Path:
        return Path(self.env["HOME"])

    def command(self, *argv: str, as_root: bool = False) -> list[str]:
        """``argv`` prefixed so that it runs inside the private mount namespace, as :attr:`uid`
        unless ``as_root``.

        setpriv still holds root's capabilities while it execs ``argv[0]``, so a program the
        user may not reach (under ``/root``) still starts: go through ``sh -c 'exec ...'`` to
        check what the user can run.
        """
        drop: list[str] = []
        if self.uid != os.geteuid() and not as_root:
            drop = ["setpriv", f"--reuid={self.uid}", f"--regid={self.uid}", "--clear-groups", "--"]
        return ["nsenter", f"--target={self.journald_pid}", "--mount", "--", *drop, *argv]

    def give(self, *paths: Path) -> None:
        """Make ``paths`` (files or whole trees) belong to :attr:`uid`, so its services can use
        them (a no-op for a root manager)."""
        if self.uid == os.geteuid():
            return
        for path in paths:
            for item in (path, *(path.rglob("*") if path.is_dir() else ())):
                os.lchown(item, self.uid, self.uid)

    def run(
        self, *argv: str, check: bool = False, timeout: float = 30.0, as_root: bool = False
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` inside the namespace with :attr:`env`; capture text output."""
        return subprocess.run(
            self.command(*argv, as_root=as_root),
            env=self.env,
            capture_output=True,
            text=True,
            check=check,
            timeout=timeout,
        )

    def systemctl(
        self, *args: str, check: bool = False, timeout: float = 30.0
    ) -> subprocess.CompletedProcess[str]:
        """``systemctl --user --no-pager ARGS`` against this manager."""
        return self.run("systemctl", "--user", "--no-pager", *args, check=check, timeout=timeout)

    def journalctl(
        self, *args: str, check: bool = False, timeout: float = 30.0
    ) -> subprocess.CompletedProcess[str]:
        """``journalctl --no-pager ARGS`` on this journald's journal (only), run as root.

        Use ``--user-unit=UNIT``, not ``--user -u UNIT``: systemd 252's ``--user`` only opens
        ``user-<uid>.journal`` files, and journald writes root's records to ``system.journal``
        (fixed in systemd 254, PR #27961). ``--user-unit`` also matches ``_UID=`` of the caller
        (root): for an unprivileged manager's services match ``_SYSTEMD_USER_UNIT=`` instead.
        """
        return self.run(
            "journalctl", "--no-pager", *args, check=check, timeout=timeout, as_root=True
        )

    def show(self, unit: str, *properties: str) -> dict[str, str]:
        """``systemctl --user show -p P... UNIT`` as a dict."""
        args = [arg for prop in properties for arg in ("-p", prop)]
        out = self.systemctl("show", *args, unit, check=True).stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def install_unit(self, name: str, text: str) -> Path:
        """Write ``name`` into :attr:`unit_dir` and ``daemon-reload``."""
        path = self.unit_dir / name
        path.write_text(text, encoding="utf-8")
        self.give(path)
        self.systemctl("daemon-reload", check=True)
        return path


# --------------------------------------------------------------------------- start/stop


def _notify_socket(path: Path, mode: int | None = None) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        sock.bind(str(path))
        if mode is not None:  # an unprivileged manager must be able to send to it
            path.chmod(mode)
    except OSError:
        sock.close()
        raise
    return sock


def _tail(path: Path, limit: int = 2000) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")[-limit:].strip()
    except OSError:
        text = ""
    # systemd --user writes errors from before its log target is set up to /dev/console.
    return text or "no output (early systemd errors go to /dev/console: try strace -e writev)"


def _wait_ready(
    sock: socket.socket, proc: subprocess.Popen[bytes], *, what: str, log: Path, timeout: float
) -> None:
    """Block until ``proc`` sends ``READY=1`` on ``sock`` (sd_notify protocol)."""
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise StartupError(f"{what} sent no READY=1 within {timeout:g}s: {_tail(log)}")
        sock.settimeout(min(remaining, 0.1))
        try:
            message = sock.recv(4096)
        except TimeoutError:
            if proc.poll() is not None:
                raise StartupError(
                    f"{what} exited with status {proc.returncode} before READY=1: {_tail(log)}"
                ) from None
            continue
        if b"READY=1" in message.split(b"\n"):
            return


def _start_ready(
    argv: list[str], *, env: dict[str, str], sock: socket.socket, log: Path, timeout: float
) -> subprocess.Popen[bytes]:
    """Start ``argv`` with ``sock`` as its NOTIFY_SOCKET; return once it has sent ``READY=1``.

    Its output goes to ``log``, which is quoted in the error if it does not come up.
    """
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv,
            env={**env, "NOTIFY_SOCKET": sock.getsockname()},
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        _wait_ready(sock, proc, what=Path(argv[-1]).name, log=log, timeout=timeout)
    except BaseException:
        _stop(proc, timeout)
        raise
    return proc


def _inaccessible_nodes(directory: Path) -> None:
    """What PID 1 creates at boot in ``/run/systemd/inaccessible``: one node of each type, mode
    0000, which root's user manager mounts over what a sandbox hides (``/dev/kmsg``, ...)."""
    directory.mkdir()
    (directory / "dir").mkdir()
    (directory / "reg").touch()
    os.mkfifo(directory / "fifo")
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(directory / "sock"))
    os.mknod(directory / "chr", 0o600 | stat.S_IFCHR, os.makedev(0, 0))
    os.mknod(directory / "blk", 0o600 | stat.S_IFBLK, os.makedev(0, 0))
    for node in directory.iterdir():
        node.chmod(0)
    directory.chmod(0o555)


def _populated(cgroup: Path) -> bool:
    events = (cgroup / "cgroup.events").read_text(encoding="ascii")
    return "populated 1" in events.splitlines()


def _pids_in(cgroup: Path) -> list[int]:
    pids: list[int] = []
    for procs in sorted(cgroup.rglob("cgroup.procs")):
        with contextlib.suppress(FileNotFoundError):
            pids += [int(p) for p in procs.read_text(encoding="ascii").split()]
    return pids


def _describe(pids: list[int]) -> str:
    parts = []
    for pid in pids:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
            parts.append(f"{pid} {cmdline.decode(errors='replace').strip()}")
        except OSError:
            parts.append(str(pid))
    return "; ".join(parts)


def _kill_cgroup(cgroup: Path, timeout: float) -> None:
    kill_file = cgroup / "cgroup.kill"
    if kill_file.exists():  # Linux >= 5.14
        kill_file.write_text("1", encoding="ascii")
    else:
        for pid in _pids_in(cgroup):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not _populated(cgroup), timeout=timeout, what=f"{cgroup} to empty")


def _remove_tree(root: Path | None) -> list[str]:
    """rmdir a cgroup tree bottom-up; return what could not be removed."""
    failures = []
    if root is not None and root.exists():
        for dirpath, _dirnames, _files in os.walk(root, topdown=False):
            try:
                Path(dirpath).rmdir()
            except FileNotFoundError:
                continue
            except OSError as e:
                failures.append(f"cannot remove cgroup {dirpath}: {e}")
    return failures


def _pids_in_mount_ns(ns_inode: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (entry / "ns" / "mnt").stat().st_ino == ns_inode:
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def _stop(proc: subprocess.Popen[bytes], timeout: float) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def user_systemd(
    *, uid: int | None = None, start_timeout: float = 20.0, stop_timeout: float = 30.0
) -> Iterator[UserSystemd]:
    """Start journald + ``systemd --user`` privately; stop both and prove nothing is left.

    The manager runs as ``uid`` (default: this process's, root): see :func:`unprivileged_uid`.

    Raises :class:`StartupError` if either daemon does not come up, and, at exit,
    :class:`LeftoverProcessesError` if the teardown had to kill anything.
    """
    reason = unavailable_reason()
    if reason is not None:
        raise StartupError(reason)
    systemd_bin = _first_existing(SYSTEMD_CANDIDATES)
    journald_bin = _first_existing(JOURNALD_CANDIDATES)
    cgroups = _cgroups()
    assert systemd_bin is not None and journald_bin is not None and cgroups is not None

    base = Path(tempfile.mkdtemp(prefix="sdenv-", dir=_BASE_PARENT))
    assert len(str(base)) <= _MAX_BASE_LEN, base
    uid = os.geteuid() if uid is None else uid
    drop = uid != os.geteuid()
    if drop and unprivileged_uid() is None:
        raise StartupError("setpriv is needed to run a user manager as another uid")
    user = pwd.getpwuid(uid)
    home, runtime, config, run = base / "home", base / "runtime", base / "config", base / "run"
    for d in (
        home,
        config / "systemd" / "user",
        run / "system",
        # A booted host has these; the manager needs them to set up mount namespaces for
        # sandboxing options (see docs/systemd-testing.md).
        run / "unit-root",
        base / "run-user",
        run / "journal",
        run / "journald.conf.d",
        run / "user.conf.d",
        base / "log",
        base / "empty",
    ):
        d.mkdir(parents=True)
    runtime.mkdir(mode=0o700)
    # /run/user/<uid> is XDG_RUNTIME_DIR on a real machine; systemd 252 looks for its
    # inaccessible/ nodes there rather than in $XDG_RUNTIME_DIR.
    (base / "run-user" / str(uid)).symlink_to(runtime)
    _inaccessible_nodes(run / "inaccessible")
    (run / "journald.conf.d" / "test.conf").write_text(_JOURNALD_CONF, encoding="utf-8")
    (run / "user.conf.d" / "test.conf").write_text(_USER_CONF, encoding="utf-8")
    env = {
        "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
        "LANG": "C.UTF-8",
        "USER": user.pw_name,
        "LOGNAME": user.pw_name,
        "SHELL": "/bin/sh",
        "HOME": str(home),
        "XDG_RUNTIME_DIR": str(runtime),
        "XDG_CONFIG_HOME": str(config),
        "XDG_DATA_HOME": str(home / ".local" / "share"),
        "XDG_STATE_HOME": str(home / ".local" / "state"),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "DBUS_SESSION_BUS_ADDRESS": f"unix:path={runtime}/bus",
        "SYSTEMD_COLORS": "0",
        "TERM": "dumb",
    }
    cgroup = cgroups.tracking / f"{base.name}.slice" / f"user@{user.pw_uid}.service"
    mirror = cgroups.mirror / f"{base.name}.slice" if cgroups.mirror else None

    journald: subprocess.Popen[bytes] | None = None
    manager: subprocess.Popen[bytes] | None = None
    ns_inode: int | None = None
    leftovers: list[str] = []
    # The notify sockets stay open until both daemons are gone: journald keeps sending
    # FDSTORE=1 (its stdout streams) to NOTIFY_SOCKET and logs an error if it is closed.
    with contextlib.ExitStack() as sockets:
        try:
            cgroup.mkdir(parents=True)
            if drop:  # what PID 1 does for user@.service: the user's tree, delegated
                base.chmod(0o755)
                for path in (home, runtime, config):
                    for item in (path, *path.rglob("*")):
                        os.lchown(item, uid, uid)
                for name in ("", "cgroup.procs", "cgroup.subtree_control", "cgroup.threads"):
                    os.chown(cgroup / name, uid, uid)
                if mirror is not None:
                    (mirror / cgroup.name).mkdir(parents=True)
                    for name in ("", "cgroup.procs", "tasks"):
                        os.chown(mirror / cgroup.name / name, uid, uid)
            journald = _start_ready(
                [*_UNSHARE, "sh", "-c", _NAMESPACE_SCRIPT, "sh", str(base), journald_bin],
                env={"PATH": env["PATH"], "SYSTEMD_LOG_TARGET": "console"},
                sock=sockets.enter_context(_notify_socket(base / "journald.notify")),
                log=base / "journald.log",
                timeout=start_timeout,
            )
            ns_inode = Path(f"/proc/{journald.pid}/ns/mnt").stat().st_ino
            nsenter = ["nsenter", f"--target={journald.pid}", "--mount", "--"]
            manager = _start_ready(
                [
                    *nsenter,
                    *("sh", "-c", _MANAGER_SCRIPT, "sh", str(cgroup), systemd_bin),
                    str(uid) if drop else "",
                ],
                env=env,
                sock=sockets.enter_context(
                    _notify_socket(base / "manager.notify", mode=0o777 if drop else None)
                ),
                log=base / "manager.log",
                timeout=start_timeout,
            )
            sd = UserSystemd(
                base=base,
                env=env,
                unit_dir=config / "systemd" / "user",
                journal_dir=base / "log" / "journal",
                cgroup=cgroup,
                journald_pid=journald.pid,
                manager_pid=manager.pid,
                uid=uid,
            )
            # READY=1 comes at basic.target; wait for default.target ("running") too.
            state = sd.systemctl("is-system-running", "--wait", timeout=start_timeout)
            if state.stdout.strip() != "running":
                failed = sd.systemctl("list-units", "--failed", "--plain", "--no-legend")
                raise StartupError(
                    f"user manager is {state.stdout.strip()!r}; failed units: {failed.stdout}"
                )
            yield sd
        finally:
            if manager is not None:
                _stop(manager, stop_timeout)  # SIGTERM: the user manager runs exit.target
            if cgroup.exists():
                if _populated(cgroup):
                    leftovers.append(f"in {cgroup}: {_describe(_pids_in(cgroup))}")
                    _kill_cgroup(cgroup, stop_timeout)
                leftovers += _remove_tree(cgroup.parent)
            leftovers += _remove_tree(mirror)
            if journald is not None:
                _stop(journald, stop_timeout)
            if ns_inode is not None:
                pids = _pids_in_mount_ns(ns_inode)
                if pids:
                    leftovers.append(f"in the private mount namespace: {_describe(pids)}")
                    for pid in pids:
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, signal.SIGKILL)
            shutil.rmtree(base, ignore_errors=True)
            if leftovers:  # raised even if the body failed; that error becomes __context__
                raise LeftoverProcessesError("; ".join(leftovers))
