"""``memstaged service install`` and ``uninstall`` against a stand-in ``systemctl`` (a script of
the test's own that records its calls): the unit written, reloads, enable and start, upgrades,
and what an uninstall keeps.

The rest of the systemd integration without systemd is in ``tests/cli/test_service.py``; against
a real user manager, in ``test_systemd_service.py``.
"""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import stat
import subprocess
from pathlib import Path

import pytest
from support.helpers import memstaged_cmd, memstaged_env, without_dac_override

from memstaged.cli import systemd_unit
from memstaged.cli.main import main


@pytest.fixture
def fake_systemctl(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A `systemctl` on PATH that records its arguments, and fails when FAIL_ON matches."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "systemctl.calls"
    script = bin_dir / "systemctl"
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> {shlex.quote(str(calls))}\n'
        'case "$*" in *"$FAIL_ON"*) if [ -n "$FAIL_ON" ]; then '
        'echo "Failed to $FAIL_ON: Unit memstaged.service has a bad setting." >&2; exit 1; fi;; '
        "esac\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("FAIL_ON", raising=False)
    return calls


def _calls(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_service_install_writes_the_unit_and_reloads(
    fake_systemctl: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`memstaged service install` writes the unit under $XDG_CONFIG_HOME/systemd/user with the
    absolute path of this installation's memstaged, and runs daemon-reload; nothing else."""
    assert main(["service", "install"]) == 0
    unit = tmp_path / "config" / "systemd" / "user" / "memstaged.service"
    exec_start = [ln for ln in unit.read_text().splitlines() if ln.startswith("ExecStart=")]
    executable = exec_start[0].removeprefix("ExecStart=")
    assert os.path.isabs(executable) and os.access(executable, os.X_OK)
    assert Path(executable).name == "memstaged"
    assert stat.S_IMODE(unit.stat().st_mode) == 0o644
    state = "--user --no-ask-password show -p LoadState,ActiveState,UnitFileState,FragmentPath"
    assert _calls(fake_systemctl) == [
        f"{state} memstaged.service",
        "--user --no-ask-password show-environment",
        "--user --no-ask-password daemon-reload",
        f"{state} memstaged.service",
    ]
    assert "then run: systemctl --user enable --now memstaged" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("config_text", "reason"),
    [
        (None, "no memory dir is configured in {config}"),
        ("settle = 1\n", "no memory dir is configured in {config}"),
        ("memory_dirs = [\n", "{config}: not valid TOML: "),
        ("memory_dir = []\n", "{config}: unknown key 'memory_dir'"),
    ],
)
def test_service_install_enable_without_memory_dirs_starts_nothing(
    fake_systemctl: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    config_text: str | None,
    reason: str,
) -> None:
    """Issue 13 (README item 1): `install --enable` with no config, a config without
    memory_dirs, or a bad config writes the unit but neither enables nor starts it (the service
    would exit 2 at once and stay failed); it says why and what to run in one line, exit 1."""
    if config_text is not None:
        _configure(tmp_path, config_text)
    config = tmp_path / "config" / "memstaged" / "config.toml"
    assert main(["service", "install", "--enable"]) == 1
    assert (tmp_path / "config" / "systemd" / "user" / "memstaged.service").is_file()
    assert not any(" enable " in c or "start" in c for c in _calls(fake_systemctl))
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1
    assert err[0].startswith("memstaged: not enabled or started: " + reason.format(config=config))
    assert err[0].endswith("then run: systemctl --user enable --now memstaged")


def test_service_install_reads_the_config_the_service_will_read(
    fake_systemctl: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 13 (README item 1): the check uses the user manager's environment (HOME,
    XDG_CONFIG_HOME as `systemctl --user show-environment` gives them), not this shell's, and
    the service's working directory (the home directory) for the default ./.pi/memory/project."""
    home = tmp_path / "service-home"
    (home / ".pi" / "memory" / "project" / "staging").mkdir(parents=True)
    env_file = tmp_path / "manager.env"
    env_file.write_text(f"HOME={home}\nXDG_CONFIG_HOME={tmp_path / 'nowhere'}\n")
    script = Path(shutil.which("systemctl") or "")
    script.write_text(
        script.read_text().replace(
            "case", f'[ "$2 $3" = "--no-ask-password show-environment" ] && cat {env_file}\ncase', 1
        )
    )
    assert main(["service", "install", "--enable"]) == 0  # ~/.pi/memory/project of the service
    assert "--user --no-ask-password start memstaged.service" in _calls(fake_systemctl)


def _configure(
    tmp_path: Path, text: str = 'memory_dirs = ["~/src/*/.pi/memory/project"]\n'
) -> None:
    path = tmp_path / "config" / "memstaged" / "config.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_service_install_enable_starts_it_and_uninstall_undoes_it(
    fake_systemctl: Path, tmp_path: Path
) -> None:
    """--enable also enables and starts the unit when memory dirs are configured (a glob
    that matches nothing yet is fine: the daemon waits for it); uninstall stops, disables,
    removes the file and reloads."""
    _configure(tmp_path)
    assert main(["service", "install", "--enable"]) == 0
    assert _calls(fake_systemctl)[3:5] == [
        "--user --no-ask-password enable memstaged.service",
        "--user --no-ask-password start memstaged.service",
    ]
    fake_systemctl.unlink()
    assert main(["service", "uninstall"]) == 0
    unit = tmp_path / "config" / "systemd" / "user" / "memstaged.service"
    assert not unit.exists()
    calls = _calls(fake_systemctl)
    assert calls[1] == "--user --no-ask-password disable --now memstaged.service"
    assert "--user --no-ask-password daemon-reload" in calls


def test_service_install_failure_is_one_line_and_exit_2(
    fake_systemctl: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A systemctl failure ends as one line naming the command, exit code 2, no traceback."""
    _configure(Path(os.environ["XDG_CONFIG_HOME"]).parent)
    monkeypatch.setenv("FAIL_ON", "start")
    assert main(["service", "install", "--enable"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "memstaged: systemctl --user start memstaged.service: "
        "Failed to start: Unit memstaged.service has a bad setting."
    ]


def test_service_without_systemctl_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """On a machine without systemctl, install fails with one clear line."""
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    assert main(["service", "install"]) == 2
    assert "systemctl is not installed" in capsys.readouterr().err


def test_service_install_sandbox_refused_when_the_manager_cannot_run_it(
    fake_systemctl: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Issue 13 (the unit): where the check unit fails (user namespaces off, ...), --sandbox
    says so in one line, exit 2, writes no drop-in, enables nothing, and removes the check
    unit."""
    _configure(tmp_path)
    monkeypatch.setenv("FAIL_ON", "start memstaged-sandbox-check")
    assert main(["service", "install", "--enable", "--sandbox"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith("memstaged: the sandbox cannot run in this user manager")
    units = tmp_path / "config" / "systemd" / "user"
    assert not (units / "memstaged.service.d").exists()
    assert not (units / "memstaged-sandbox-check.service").exists()
    assert not any(" enable " in c for c in _calls(fake_systemctl))


def _active_systemctl(fake_systemctl: Path) -> None:
    """The stand-in systemctl says the service is enabled and runs (``show``)."""
    script = Path(shutil.which("systemctl") or "")
    assert script.parent == fake_systemctl.parent / "bin"
    state = "LoadState=loaded\nActiveState=active\nUnitFileState=enabled\n"
    text = script.read_text().replace(
        "case", f'[ "$3" = "show" ] && printf "{state}" && exit 0\ncase', 1
    )
    script.write_text(text)


def test_service_install_says_what_changed_and_restarts_only_when_asked(
    fake_systemctl: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 22 item 9: `service install --enable` over a unit that ran another installation's
    memstaged (pipx's) says the old and the new ExecStart, and does not restart the running
    service: it says how; `--restart` restarts it."""
    _configure(tmp_path)
    _active_systemctl(fake_systemctl)
    unit = tmp_path / "config" / "systemd" / "user" / "memstaged.service"
    old = "/home/ana/.local/pipx/venvs/memstaged/bin/memstaged"
    unit.parent.mkdir(parents=True)
    unit.write_text(systemd_unit.unit_text(old))
    assert main(["service", "install", "--enable"]) == 0
    new = systemd_unit.installed_executable()
    out = capsys.readouterr().out.splitlines()
    assert out[1:6] == [
        "changed ExecStart:",
        f"  - ExecStart={old}",
        f"  + ExecStart={new}",
        "changed ExecReload:",
        f"  - ExecReload={old} config check --reload $MAINPID",
    ]
    assert (
        "memstaged.service is running as it was installed before; to run the unit just "
        "written: systemctl --user restart memstaged (or service install --restart)"
    ) in out
    calls = _calls(fake_systemctl)
    assert not any("restart" in c for c in calls)
    assert "--user --no-ask-password start memstaged.service" in calls  # a no-op when running

    fake_systemctl.unlink()
    assert main(["service", "install", "--restart"]) == 0  # unchanged now: nothing to say
    out = capsys.readouterr().out.splitlines()
    assert not any(line.startswith("changed ") for line in out)
    assert "restarted memstaged.service" in out
    assert "--user --no-ask-password restart memstaged.service" in _calls(fake_systemctl)


def test_service_uninstall_lists_what_stays_and_purge_keeps_the_memory_dirs(
    fake_systemctl: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Issue 22 item 9: `service uninstall` lists what it leaves (the config, the state, each
    memory dir's deadletter/); `--purge` removes memstaged's own config and state and nothing
    of a memory dir: its staging/ and deadletter/ keep every byte."""
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_STATE_HOME", str(home / ".local" / "state"))
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    monkeypatch.delenv("MEMSTAGED_CONFIG", raising=False)
    monkeypatch.delenv("MEMSTAGED_MEMORY_DIRS", raising=False)
    monkeypatch.delenv("MEMSTAGED_LOG_FILE", raising=False)
    mdir = home / "src" / "app" / ".pi" / "memory" / "project"
    (mdir / "staging").mkdir(parents=True)
    (mdir / "staging" / "s.json").write_bytes(b"[]")
    (mdir / "deadletter" / "originals").mkdir(parents=True)
    (mdir / "deadletter" / "r.json").write_bytes(b'{"record": 1}')
    _configure(tmp_path, 'memory_dirs = ["~/src/*/.pi/memory/project"]\n')
    config_dir = tmp_path / "config" / "memstaged"
    state = home / ".local" / "state" / "memstaged"
    state.mkdir(parents=True)
    (state / "decisions.jsonl").write_text("{}\n")
    before = {p: p.read_bytes() for p in mdir.rglob("*") if p.is_file()}

    assert main(["service", "uninstall"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1:] == [
        "kept (--purge removes them):",
        f"  {config_dir}  (config)",
        f"  {state}  (state (the decision log, the seen cache))",
        "kept, never removed by uninstall (quarantined files: recover or purge them with "
        "memstaged deadletter before uninstalling):",
        f"  {mdir / 'deadletter'}",
    ]
    assert config_dir.is_dir() and state.is_dir()

    assert main(["service", "uninstall", "--purge"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1:3] == [f"removed {config_dir}", f"removed {state}"]
    assert f"  {mdir / 'deadletter'}" in out
    assert not config_dir.exists() and not state.exists()
    assert {p: p.read_bytes() for p in mdir.rglob("*") if p.is_file()} == before


def test_purge_removes_the_rotated_logs_and_nothing_named_like_them(
    fake_systemctl: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Issue 29 (an attack on the new file layer): with the decision log at ``~/notes``,
    `uninstall --purge` removed every ``notes.*``, the user's ``notes.txt`` and a whole
    ``notes.d/`` with it. Rotation makes ``notes.1`` to ``notes.N`` only: those go, and
    nothing else."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_STATE_HOME", str(home / ".local" / "state"))
    monkeypatch.delenv("MEMSTAGED_CONFIG", raising=False)
    monkeypatch.delenv("MEMSTAGED_MEMORY_DIRS", raising=False)
    log = home / "notes"
    monkeypatch.setenv("MEMSTAGED_LOG_FILE", str(log))
    for name in ("notes", "notes.1", "notes.2", "notes.txt", "notes.1.bak"):
        (home / name).write_text("x\n")
    (home / "notes.d").mkdir()
    (home / "notes.d" / "mine").write_text("mine\n")
    assert main(["service", "uninstall", "--purge"]) == 0
    capsys.readouterr()
    assert sorted(p.name for p in home.iterdir()) == ["notes.1.bak", "notes.d", "notes.txt"]
    assert (home / "notes.d" / "mine").read_text() == "mine\n"


def test_uninstall_that_cannot_remove_the_unit_says_so_in_one_line(
    fake_systemctl: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Issue 29 (an attack on the new file layer): a directory where the unit file should be
    made `service uninstall` end in a traceback; it is one line (exit 2)."""
    unit = systemd_unit.unit_dir() / systemd_unit.UNIT_NAME
    unit.mkdir(parents=True)
    (unit / "keep").write_text("x")
    assert main(["service", "uninstall"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert f"cannot remove {unit}" in err
    assert (unit / "keep").read_text() == "x"


def test_purge_removes_only_memstageds_own_metrics_file_and_dead_sockets(
    fake_systemctl: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Issue 31 item 9, with real files and real sockets: `uninstall --purge` removes the
    metrics file when it is a regular file, and each control socket no process listens on. A
    link at the metrics path (and what it points to), a socket a daemon still listens on, and
    a file that only has a socket's name are left as they are; the live socket is said."""
    monkeypatch.delenv("MEMSTAGED_METRICS_FILE", raising=False)
    precious = tmp_path / "precious.prom"
    precious.write_text("# not memstaged's\n")
    metrics = tmp_path / "textfile" / "memstaged.prom"
    metrics.parent.mkdir()
    metrics.symlink_to(precious)
    _configure(tmp_path, f'metrics_file = "{metrics}"\n')
    runtime = Path(os.environ["XDG_RUNTIME_DIR"]) / "memstaged"
    runtime.mkdir(parents=True, mode=0o700)
    stale, live, fake = (runtime / f"daemon-{n}.sock" for n in (1, 2, 3))
    with socket.socket(socket.AF_UNIX) as gone:
        gone.bind(str(stale))  # closed without unlinking: as a killed daemon leaves it
    fake.write_text("not a socket\n")
    with socket.socket(socket.AF_UNIX) as listening:
        listening.bind(str(live))
        listening.listen()
        assert main(["service", "uninstall", "--purge"]) == 0
        out = capsys.readouterr().out.splitlines()
        assert f"removed {stale}" in out
        assert not any(str(metrics) in line or str(fake) in line for line in out)
        assert out[-2:] == [
            "kept, a memstaged daemon outside the service still listens on them (stop it first):",
            f"  {live}",
        ]
        assert stat.S_ISSOCK(live.lstat().st_mode)
    assert not os.path.lexists(stale)
    assert metrics.is_symlink() and precious.read_text() == "# not memstaged's\n"
    assert fake.read_text() == "not a socket\n"

    metrics.unlink()
    metrics.write_text("memstaged_memory_dirs_not_watched 4\n")
    _configure(tmp_path, f'metrics_file = "{metrics}"\n')  # the purge above removed it
    assert main(["service", "uninstall"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert f"  {metrics}  (metrics file)" in out
    assert f"  {live}  (control socket of a daemon that is gone)" in out  # no one listens now
    assert main(["service", "uninstall", "--purge"]) == 0
    assert f"removed {metrics}" in capsys.readouterr().out.splitlines()
    assert not metrics.exists()


@pytest.mark.parametrize("where", ["config", "state"])
def test_purge_keeps_a_tree_with_memory_data_the_config_does_not_list(
    fake_systemctl: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    where: str,
) -> None:
    """A memory dir inside memstaged's config or state dir, with a config file the strict
    loader refuses (one bad key: the memory dirs cannot be listed), was removed by `uninstall
    --purge`, its deadletter/ with it. A tree with a ``staging/`` or ``deadletter/`` in it is
    kept, and said; every byte of the memory dir stays."""
    config_dir, state = _private_home(tmp_path, monkeypatch)
    tree = config_dir if where == "config" else state
    mdir = tree / "app" / ".pi" / "memory" / "project"
    (mdir / "staging").mkdir(parents=True)
    (mdir / "staging" / "s.json").write_bytes(b"[]")
    (mdir / "deadletter" / "originals").mkdir(parents=True)
    (mdir / "deadletter" / "r.json").write_bytes(b'{"record": 1}')
    _configure(tmp_path, f'memory_dirs = ["{mdir}"]\nsettle = "soon"\n')
    before = {p: p.read_bytes() for p in mdir.rglob("*") if p.is_file()}

    assert main(["service", "uninstall", "--purge"]) == 0
    out = capsys.readouterr().out
    assert f"  {tree}  (" in out and "may be a memory dir's" in out, out
    assert {p: p.read_bytes() for p in mdir.rglob("*") if p.is_file()} == before


def _private_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """A home of the test's own, no MEMSTAGED_* variable: the config dir and the state dir."""
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_STATE_HOME", str(home / ".local" / "state"))
    for name in ("CONFIG", "MEMORY_DIRS", "LOG_FILE", "METRICS_FILE"):
        monkeypatch.delenv(f"MEMSTAGED_{name}", raising=False)
    state = home / ".local" / "state" / "memstaged"
    state.mkdir(parents=True)
    return tmp_path / "config" / "memstaged", state


def test_purge_keeps_a_tree_too_deep_to_look_through_without_a_traceback(
    fake_systemctl: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A state dir holding a chain of 1,500 directories made `uninstall --purge` end in a
    RecursionError traceback (a recursive walk). The walk keeps its own stack and stops at
    TREE_DEPTH_LIMIT levels: the tree is kept and said, exit 0."""
    from memstaged.cli.own_files import TREE_DEPTH_LIMIT

    _, state = _private_home(tmp_path, monkeypatch)
    (state / "decisions.jsonl").write_text("{}\n")
    fd = os.open(state, os.O_RDONLY)
    try:
        for _ in range(1_500):  # relative to a descriptor: the path would pass PATH_MAX
            os.mkdir("a", dir_fd=fd)
            deeper = os.open("a", os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = deeper
    finally:
        os.close(fd)
    try:
        assert main(["service", "uninstall", "--purge"]) == 0
    finally:  # pytest's own clean-up of old temp dirs is recursive: it would fail on the chain
        subprocess.run(["rm", "-rf", str(state / "a")], check=True)
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    assert f"deeper than {TREE_DEPTH_LIMIT} levels" in out, out
    assert (state / "decisions.jsonl").read_text() == "{}\n"


def test_purge_removes_rotated_logs_only_as_regular_files(
    fake_systemctl: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A directory with a rotated log's name (``d.jsonl.3/``, the user's notes inside) was
    removed whole by `uninstall --purge`. A decision log and its rotations are removed only
    while they are regular files; the directory is neither listed nor touched."""
    _private_home(tmp_path, monkeypatch)
    logs = tmp_path / "logs"
    (logs / "d.jsonl.3" / "notes").mkdir(parents=True)
    (logs / "d.jsonl.3" / "notes" / "todo.txt").write_text("mine\n")
    (logs / "d.jsonl").write_text("{}\n")
    (logs / "d.jsonl.1").write_text("{}\n")
    monkeypatch.setenv("MEMSTAGED_LOG_FILE", str(logs / "d.jsonl"))
    assert main(["service", "uninstall", "--purge"]) == 0
    out = capsys.readouterr().out
    assert "d.jsonl.3" not in out, out
    assert (logs / "d.jsonl.3" / "notes" / "todo.txt").read_text() == "mine\n"
    assert sorted(p.name for p in logs.iterdir()) == ["d.jsonl.3"]


def test_purge_keeps_a_tree_with_a_directory_it_cannot_list(tmp_path: Path) -> None:
    """A state dir with a directory memstaged may not list (mode 000, run without root's
    override of permissions) was purged in part: the files beside it went, then the removal
    failed (exit 2). The tree is kept whole and said, exit 0."""
    prefix = without_dac_override()
    env = memstaged_env(tmp_path, HOME=str(tmp_path / "home"))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "systemctl").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "systemctl").chmod(0o755)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    del env["MEMSTAGED_LOG_FILE"]
    state = Path(env["XDG_STATE_HOME"]) / "memstaged"
    (state / "seen" / "locked" / "x").mkdir(parents=True)
    (state / "decisions.jsonl").write_text("{}\n")
    (state / "seen" / "cache").write_text("c\n")
    (state / "seen" / "locked").chmod(0)
    try:
        result = subprocess.run(
            [*prefix, *memstaged_cmd("service", "uninstall", "--purge")],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        (state / "seen" / "locked").chmod(0o700)
    assert result.returncode == 0, result.stderr
    assert "cannot be listed: Permission denied" in result.stdout, result.stdout
    assert (state / "decisions.jsonl").read_text() == "{}\n"
    assert (state / "seen" / "cache").read_text() == "c\n"
