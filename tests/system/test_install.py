"""However memstaged was installed: completions, the man page, upgrades and uninstalls.

Issue 22 items 6, 8, 9 and 10, tested as a new user meets them: a fresh home directory (laid
out from /etc/skel, as ``useradd -m`` does: its .bashrc loads bash-completion), memstaged on
``~/.local/bin`` (a link to this venv's script, as pipx makes one to its venv's), a real
``bash -i`` in an 80-column terminal (tmux) where Tab is pressed, and ``man`` reading the page
installed for that user. Issue 31 items 3, 12, 13 and 14: what ``make install`` needs of Debian
and who may install it (an unprivileged user, without sudo), what it says of PATH, the version
a build takes from git, and the release files (``make dist``) installed with pipx: the slow test
at the end, which compiles systemd-python.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from importlib import metadata
from pathlib import Path
from typing import Final

import pytest
from support import as_nobody
from support.systemd_env import unavailable_reason, user_systemd, wait_until
from support.terminal import COLUMNS, terminal

from memstaged.cli.generate import DATA, FILES

REPO: Final = Path(__file__).resolve().parents[2]
MEMSTAGED: Final = Path(sys.executable).parent / "memstaged"
#: The man page's sections that issue 22 item 8 asks for, beside argparse's.
SECTIONS: Final = (
    "EXIT STATUS",
    "SIGNALS",
    "ENVIRONMENT",
    "FILES",
    "CONFIGURATION",
    "SLOW WRITERS",
    "EXAMPLES",
)


def _fresh_home(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A new user's home (from /etc/skel) with memstaged on ~/.local/bin, and the environment
    a login would give: no XDG_* set, ~/.local/bin on PATH (as ``pipx ensurepath`` does)."""
    home = tmp_path / "home"
    shutil.copytree("/etc/skel", home) if Path("/etc/skel").is_dir() else home.mkdir()
    (home / ".local" / "bin").mkdir(parents=True)
    (home / ".local" / "bin" / "memstaged").symlink_to(MEMSTAGED)
    env = {
        "HOME": str(home),
        "USER": "newuser",
        "PATH": f"{home}/.local/bin:/usr/local/bin:/usr/bin:/bin",
        "TERM": "xterm-256color",
        "LANG": "C.UTF-8",
        "PAGER": "less",
        "MANPAGER": "less",
    }
    return home, env


def _pressed_tab(home: Path, env: dict[str, str], install: bool) -> str:
    """The screen of a new ``bash -i`` after typing ``memstaged dead`` and Tab."""
    with terminal(["bash", "-i"], env, str(home)) as term:
        term.run("echo ready-$((40 + 2))", r"^ready-42$")
        if install:
            term.run("memstaged completion --install", r"^new shells complete memstaged")
            term.type("exec bash -i")  # a new shell, as the output says
            term.send("Enter")
            term.run("clear; echo ready-$((40 + 3))", r"^ready-43$")
        term.type("memstaged dead")
        term.send("Tab")
        term.type("X")  # a marker: it follows whatever Tab completed
        found = term.wait_for(r"memstaged dead[^\n]*X")
        return found.group(0)


def test_bash_completes_memstaged_in_a_new_shell_after_completion_install(
    tmp_path: Path,
) -> None:
    """Issue 22 item 6: after the README's one command (``memstaged completion --install``),
    a new interactive bash of a fresh account completes ``memstaged dead<Tab>`` to
    ``memstaged deadletter `` (bash-completion's per-user directory), where it completed
    nothing (file names) before."""
    if not Path("/usr/share/bash-completion/bash_completion").is_file():
        pytest.skip("bash-completion is not installed (make sysdeps installs it)")
    home, env = _fresh_home(tmp_path)
    assert _pressed_tab(home, env, install=False) == "memstaged deadX"  # nothing to complete
    assert _pressed_tab(home, env, install=True) == "memstaged deadletter X"
    bash = home / ".local" / "share" / "bash-completion" / "completions" / "memstaged"
    assert bash.read_text() == (DATA / FILES["bash"]).read_text()


def _quarantined(mdir: Path, env: dict[str, str], *names: str) -> list[str]:
    """The IDs of the dead-letter records a real ``memstaged --once`` made of one unparseable
    staging file per name (old enough to be past the settle time), sorted."""
    (mdir / "staging").mkdir(parents=True)
    for name in names:
        path = mdir / "staging" / f"{name}.json"
        path.write_bytes(b'{"session_id": "%s", ' % name.encode())
        os.utime(path, (1e9, 1e9))
    decided = subprocess.run(
        [str(MEMSTAGED), "--once", "--memory-dir", str(mdir)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert decided.returncode == 0, decided.stderr
    ids = sorted(p.name[: -len(".json")] for p in (mdir / "deadletter").glob("*.json"))
    assert [i.split("-")[0] for i in ids] == sorted(names)
    return ids


def test_tab_offers_the_dead_letter_ids_in_bash(tmp_path: Path) -> None:
    """Issue 22 item 7: in a new interactive bash after ``memstaged completion --install``,
    Tab completes a record ID after ``deadletter show``, ``recover --id`` and ``purge --id``
    (the IDs of the memory dir the user's config file names: a second Tab lists them all), and
    after a ``--memory-dir`` typed on the line, that memory dir's, ``~`` and all. Before, Tab
    offered file names there."""
    if not Path("/usr/share/bash-completion/bash_completion").is_file():
        pytest.skip("bash-completion is not installed (make sysdeps installs it)")
    home, env = _fresh_home(tmp_path)
    alpha, beta = _quarantined(home / "proj" / ".pi" / "memory" / "project", env, "alpha", "beta")
    [gamma] = _quarantined(home / "other" / ".pi" / "memory" / "project", env, "gamma")
    (home / ".config" / "memstaged").mkdir(parents=True)
    (home / ".config" / "memstaged" / "config.toml").write_text(
        f'memory_dirs = ["{home}/proj/.pi/memory/project"]\n'
    )
    with terminal(["bash", "-i"], env, str(home)) as term:
        term.run("memstaged completion --install", r"^new shells complete memstaged")
        term.type("exec bash -i")
        term.send("Enter")
        term.run("clear; echo ready-$((40 + 4))", r"^ready-44$")
        for typed, completed in [
            ("memstaged deadletter show al", f"memstaged deadletter show {alpha} X"),
            ("memstaged deadletter recover --id b", f"memstaged deadletter recover --id {beta} X"),
            (
                "memstaged deadletter show --memory-dir ~/other/.pi/memory/project ",
                f"memstaged deadletter show --memory-dir ~/other/.pi/memory/project {gamma} X",
            ),
            (
                "memstaged --memory-dir ~/other/.pi/memory/project deadletter show ",
                f"memstaged --memory-dir ~/other/.pi/memory/project deadletter show {gamma} X",
            ),
        ]:
            term.type(typed)
            term.send("Tab")
            term.type("X")  # a marker: it follows whatever Tab completed
            term.wait_for(rf"^[^\n]*{re.escape(completed)}$")
            term.send("C-c")
            # The next line is typed once bash has acted on the ^C: on a busy machine, text
            # typed at once was read before the interrupt, and ended on the same line.
            term.wait_for(rf"^[^\n]*{re.escape(completed)}\^C$")
        term.type("memstaged deadletter purge --id ")
        term.send("Tab")
        term.send("Tab")  # the second Tab lists what the first could not choose between
        # Exactly the configured memory dir's two IDs on the line bash lists them on.
        term.wait_for(rf"^{re.escape(alpha)}\s+{re.escape(beta)}\s*$")


#: How each shell is started for a person who followed ``memstaged completion --install``:
#: its start-up file, its command, and the prompt it shows (short, to find on the screen).
_SHELLS: Final = {
    "zsh": (
        ".zshrc",
        # The line the install's output says to add, then compinit, as a user's .zshrc does.
        "fpath=(~/.local/share/zsh/site-functions $fpath)\n"
        "autoload -Uz compinit && compinit\n"
        "PS1='zsh> '\n",
        ["zsh", "-i"],
    ),
    "fish": (
        ".config/fish/config.fish",
        # No greeting and no autosuggestion: grey text after the cursor is on the screen too.
        "set -g fish_greeting ''\n"
        "set -g fish_autosuggestion_enabled 0\n"
        "function fish_prompt; echo -n 'fish> '; end\n",
        ["fish", "-i"],
    ),
}


@pytest.mark.parametrize("shell", ["zsh", "fish"])
def test_tab_offers_the_dead_letter_ids_in_zsh_and_fish(tmp_path: Path, shell: str) -> None:
    """Issue 22 items 6 and 7, in a real interactive zsh and fish (tmux) of a fresh account
    after ``memstaged completion --install``: Tab completes a subcommand, a record ID after
    ``deadletter show`` and ``recover --id`` (the IDs of the configured memory dir), and after
    a ``--memory-dir`` typed on the line (before or after ``deadletter``, with ``~``), that
    memory dir's IDs, as bash does. Before, the zsh and fish scripts ignored the
    ``--memory-dir`` on the line and offered the configured memory dir's IDs there."""
    if shutil.which(shell) is None:
        pytest.skip(f"{shell} is not installed (make sysdeps installs it)")
    home, env = _fresh_home(tmp_path)
    alpha, beta = _quarantined(home / "proj" / ".pi" / "memory" / "project", env, "alpha", "beta")
    [gamma] = _quarantined(home / "other" / ".pi" / "memory" / "project", env, "gamma")
    (home / ".config" / "memstaged").mkdir(parents=True)
    (home / ".config" / "memstaged" / "config.toml").write_text(
        f'memory_dirs = ["{home}/proj/.pi/memory/project"]\n'
    )
    installed = subprocess.run(
        [str(home / ".local" / "bin" / "memstaged"), "completion", "--install"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert installed.returncode == 0, installed.stderr
    rc, text, argv = _SHELLS[shell]
    (home / rc).parent.mkdir(parents=True, exist_ok=True)
    (home / rc).write_text(text)
    other = "~/other/.pi/memory/project"
    with terminal(argv, env, str(home)) as term:
        prompt = f"{shell}> "
        term.run(
            "echo ready-$((40 + 5))" if shell == "zsh" else "echo ready-(math 40 + 5)", "^ready-45$"
        )
        for typed, completed in [
            ("memstaged deadl", "memstaged deadletter X"),
            ("memstaged deadletter show al", f"memstaged deadletter show {alpha} X"),
            ("memstaged deadletter recover --id b", f"memstaged deadletter recover --id {beta} X"),
            (
                f"memstaged deadletter show --memory-dir {other} ",
                f"memstaged deadletter show --memory-dir {other} {gamma} X",
            ),
            (
                f"memstaged --memory-dir {other} deadletter show ",
                f"memstaged --memory-dir {other} deadletter show {gamma} X",
            ),
        ]:
            term.type(typed)
            term.send("Tab")
            term.type("X")  # a marker: it follows whatever Tab completed
            term.wait_for(rf"^{re.escape(prompt + completed)}$")
            term.send("C-u")  # the line is emptied, in the order the keys were typed
            term.wait_for(rf"^{re.escape(prompt)} *$")


def test_man_finds_the_page_completion_install_wrote(tmp_path: Path) -> None:
    """Issue 22 items 6 and 8: after ``memstaged completion --install``, ``man memstaged`` of
    the fresh account (its manpath derived from ~/.local/bin on PATH) shows the page on an
    80-column terminal, where a search finds its EXIT STATUS section."""
    home, env = _fresh_home(tmp_path)
    installed = subprocess.run(
        [str(home / ".local" / "bin" / "memstaged"), "completion", "--install"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert installed.returncode == 0, installed.stderr
    page = home / ".local" / "share" / "man" / "man1" / "memstaged.1"
    assert f"man: wrote {page}" in installed.stdout.splitlines()
    assert "'fpath=(~/.local/share/zsh/site-functions $fpath)'" in installed.stdout
    where = subprocess.run(
        ["man", "-w", "memstaged"], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert where.stdout.strip() == str(page), where.stderr
    with terminal(["bash", "--norc", "-i"], env, str(home)) as term:
        term.run("man memstaged", r"^MEMSTAGED\(1\)")
        term.type("/^EXIT STATUS")
        term.send("Enter")
        screen = term.wait_for(r"^EXIT STATUS\n\s+0\s+Every file got a decision").string
        assert all(len(line) <= COLUMNS for line in screen.splitlines())
        term.send("q")


def test_the_man_page_has_the_sections_a_reader_looks_for() -> None:
    """Issue 22 item 8: ``man -l`` on the generated page, formatted for 80 columns, has EXIT
    STATUS (``--once``'s and ``check``'s codes), SIGNALS, ENVIRONMENT (every ``MEMSTAGED_*``
    variable memstaged reads), FILES, CONFIGURATION (every key of config.example.toml),
    SLOW WRITERS and EXAMPLES, and no "COMMENTS" heading; no line is wider than 80."""
    if shutil.which("man") is None:
        pytest.skip("man-db is not installed (make sysdeps installs it)")
    shown = subprocess.run(
        ["man", "-l", str(DATA / FILES["man"])],
        env={**os.environ, "MANWIDTH": str(COLUMNS), "MANPAGER": "cat", "LANG": "C.UTF-8"},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    headings = re.findall(r"^([A-Z][A-Z ]+)$", shown, re.MULTILINE)
    assert set(SECTIONS) <= set(headings), headings
    assert "COMMENTS" not in headings
    assert max(len(line) for line in shown.splitlines()) <= COLUMNS

    def section(name: str) -> str:
        start = shown.index(f"\n{name}\n")
        after = [shown.find(f"\n{h}\n", start + 1) for h in headings if h != name]
        return shown[start : min(i for i in after if i > start)]

    exit_status = section("EXIT STATUS")
    for code in ("0", "1", "2", "3", "4", "5", "6", "130"):
        assert re.search(rf"^\s+{code}\s+\S", exit_status, re.MULTILINE), code
    read = set()  # the variables the code reads, however it names them
    for path in (REPO / "memstaged").rglob("*.py"):
        if path.name != "cli/manpage.py":
            text = path.read_text()
            read |= set(re.findall(r'"(MEMSTAGED_[A-Z_]+)"', text))
            found = re.findall(r'(?:ENV_PREFIX \+ |_env_value\(env, )"([A-Z_]+)"', text)
            read |= {f"MEMSTAGED_{name}" for name in found}
    read -= {"MEMSTAGED_CRASH_AT"}  # the crash tests' fault injection, not a setting
    assert {"MEMSTAGED_SETTLE", "MEMSTAGED_PAGER", "MEMSTAGED_CONFIG"} <= read
    environment = section("ENVIRONMENT")
    missing = {v for v in read if v not in environment.replace("\n", " ")}
    assert not missing
    example = (REPO / "config.example.toml").read_text()
    keys = re.findall(r"^(\w+) = ", example, re.MULTILINE)
    configuration = section("CONFIGURATION")
    assert [k for k in keys if f"\n       {k} = " not in configuration] == []
    assert "[project_roots]" in configuration
    assert "settle" in section("SLOW WRITERS")
    assert "SIGHUP" in section("SIGNALS")
    assert "memstaged completion --install" in section("EXAMPLES")


@pytest.mark.parametrize("shell", ["bash", "fish", "zsh"])
def test_completion_prints_the_packaged_script(shell: str) -> None:
    """Issue 22 item 6: ``memstaged completion SHELL`` prints that shell's generated script,
    byte for byte (``source <(memstaged completion bash)``, as gh and kubectl do)."""
    result = subprocess.run(
        [str(MEMSTAGED), "completion", shell], capture_output=True, timeout=60, check=False
    )
    assert (result.returncode, result.stderr) == (0, b"")
    assert result.stdout == (DATA / FILES[shell]).read_bytes()


def test_completion_without_a_shell_is_one_line_and_exit_2() -> None:
    """Issue 22 item 6: ``memstaged completion`` alone names what it needs, exit 2."""
    result = subprocess.run(
        [str(MEMSTAGED), "completion"], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 2
    assert result.stderr.startswith("memstaged completion: name a shell (bash, zsh or fish)")
    assert len(result.stderr.splitlines()) == 1


# -- make install / make uninstall ----------------------------------------------------------------


@pytest.fixture
def clone(tmp_path: Path) -> Path:
    """The Makefile and the generated files in a temporary directory, with this venv as its
    ``.venv`` (so ``make install`` builds nothing)."""
    work = tmp_path / "clone"
    (work / "memstaged").mkdir(parents=True)
    shutil.copy2(REPO / "Makefile", work / "Makefile")
    shutil.copy2(REPO / "pyproject.toml", work / "pyproject.toml")
    shutil.copytree(REPO / "memstaged" / "data", work / "memstaged" / "data")
    (work / ".venv").symlink_to(REPO / ".venv")
    return work


def _make(
    work: Path, prefix: Path | None, *target: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``make TARGET... PREFIX=prefix`` in ``work``, taking this venv as built (``-o``): no
    Debian package is checked, nothing is built again."""
    built = ["-o", ".venv/.installed-runtime", "-o", "builddeps", "-o", "current"]
    return subprocess.run(
        [
            "make",
            "--no-print-directory",
            *built,
            *target,
            *([f"PREFIX={prefix}"] if prefix is not None else []),
        ],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")} if root.exists() else set()


def test_make_install_refuses_to_replace_another_installations_memstaged(
    clone: Path, tmp_path: Path
) -> None:
    """Issue 22 item 9: ``make install`` after ``pipx install .`` no longer replaces pipx's
    ``~/.local/bin/memstaged`` silently: it stops (exit 2) naming the link and what to do, and
    changes nothing; ``FORCE=1`` replaces it."""
    prefix = tmp_path / "prefix"
    pipx = tmp_path / "pipx" / "venvs" / "memstaged" / "bin" / "memstaged"
    pipx.parent.mkdir(parents=True)
    pipx.write_text("#!/bin/sh\n")
    (prefix / "bin").mkdir(parents=True)
    (prefix / "bin" / "memstaged").symlink_to(pipx)
    before = _tree(prefix)
    refused = _make(clone, prefix, "install")
    assert refused.returncode != 0
    assert f"{prefix}/bin/memstaged is {pipx}, not this clone's" in refused.stderr
    assert "pipx uninstall memstaged" in refused.stderr
    assert _tree(prefix) == before
    assert os.readlink(prefix / "bin" / "memstaged") == str(pipx)
    forced = _make(clone, prefix, "install", "FORCE=1")
    assert forced.returncode == 0, forced.stderr
    assert os.readlink(prefix / "bin" / "memstaged") == f"{clone}/.venv/bin/memstaged"


def test_make_uninstall_removes_what_make_install_put(clone: Path, tmp_path: Path) -> None:
    """Issue 22 item 9: ``make uninstall`` removes exactly the link, the completions and the
    man page ``make install`` put under PREFIX, and leaves what else is there (another
    program's completions, the directories)."""
    prefix = tmp_path / "prefix"
    other = prefix / "share" / "bash-completion" / "completions" / "other"
    other.parent.mkdir(parents=True)
    other.write_text("complete -F _other other\n")
    before = _tree(prefix)
    installed = _make(clone, prefix, "install")
    assert installed.returncode == 0, installed.stderr
    added = _tree(prefix) - before
    assert {
        "bin/memstaged",
        "share/bash-completion/completions/memstaged",
        "share/zsh/site-functions/_memstaged",
        "share/fish/vendor_completions.d/memstaged.fish",
        "share/man/man1/memstaged.1",
    } <= added
    removed = _make(clone, prefix, "uninstall")
    assert removed.returncode == 0, removed.stderr
    left = _tree(prefix)
    assert not any(
        Path(p).name in ("memstaged", "_memstaged", "memstaged.fish", "memstaged.1") for p in left
    ), left
    assert before <= left
    assert other.read_text() == "complete -F _other other\n"


def test_make_install_says_how_to_reach_memstaged_when_its_bin_is_not_on_path(
    clone: Path, tmp_path: Path
) -> None:
    """Issue 31 item 12: ``make install`` into a ``bin`` that is not on the shell's PATH says
    so and prints the line that makes ``memstaged`` found in that shell, and that line works;
    with the ``bin`` on PATH it says nothing of the kind. Before, it asked "(is ... on your
    PATH?)" and left the user to find out."""
    prefix = tmp_path / "prefix"
    system_path = "/usr/local/bin:/usr/bin:/bin"
    installed = _make(clone, prefix, "install", env={**os.environ, "PATH": system_path})
    assert installed.returncode == 0, installed.stderr
    export = f'    export PATH="{prefix}/bin:$PATH"'
    assert installed.stdout.splitlines()[-4:] == [
        f"memstaged is {prefix}/bin/memstaged",
        f"{prefix}/bin is not on this shell's PATH. In this shell, run:",
        export,
        "and add that line to ~/.profile for the shells of your next login.",
    ]
    found = subprocess.run(
        ["sh", "-c", f"{export.strip()}; command -v memstaged"],
        env={"PATH": system_path},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert found.stdout.strip() == f"{prefix}/bin/memstaged"
    again = _make(
        clone, prefix, "install", env={**os.environ, "PATH": f"{prefix}/bin:{system_path}"}
    )
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines()[-1] == f"memstaged is {prefix}/bin/memstaged"
    assert "PATH" not in again.stdout


def test_make_install_into_a_new_local_bin_says_a_new_login_finds_it(
    clone: Path, tmp_path: Path
) -> None:
    """Issue 31 item 12: a new account (home from /etc/skel, no ~/.local/bin at login) runs
    ``make install``: memstaged is not found in that login (Debian's ~/.profile added
    ~/.local/bin only if it existed), and make says so, with the export line and that the next
    login has it; a new login shell (``bash -l``, reading that ~/.profile) does find it."""
    if not Path("/etc/skel/.profile").is_file():
        pytest.skip("no /etc/skel/.profile: not Debian's login set-up")
    home, _ = _fresh_home(tmp_path)
    shutil.rmtree(home / ".local")  # a new account: no ~/.local/bin yet
    env = {"HOME": str(home), "PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}

    def login_finds() -> str:
        return subprocess.run(
            ["bash", "-l", "-c", "command -v memstaged"],
            env=env,
            cwd=home,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        ).stdout.strip()

    assert login_finds() == ""
    installed = _make(clone, None, "install", env=env)
    assert installed.returncode == 0, installed.stderr
    assert installed.stdout.splitlines()[-3:] == [
        f"{home}/.local/bin is not on this shell's PATH. In this shell, run:",
        f'    export PATH="{home}/.local/bin:$PATH"',
        "Debian's ~/.profile adds ~/.local/bin at login once it exists: log in again for every"
        " shell to have it.",
    ]
    assert login_finds() == f"{home}/.local/bin/memstaged"


# -- the Debian packages: what make demo and make install need, and no sudo -----------------------

#: A program make must not call here: it says so on stderr, fails, and leaves its call in a file.
_MUST_NOT_RUN: Final = """#!/bin/sh
echo "$(basename "$0") $*" >> {calls}
echo "$(basename "$0") was called, and must not be" >&2
exit 1
"""
#: apt-get, for root: its calls are kept; ``update`` succeeds and ``install`` fails, since the
#: test cannot take real packages away and have them installed back (the one stand-in here).
_APT_GET_FOR_ROOT: Final = """#!/bin/sh
echo "apt-get $*" >> {calls}
[ "$1" = update ]
"""


def _copy_of_repo(dest: Path) -> Path:
    """This working tree's files that git knows of (committed, changed or new, not ignored),
    as a clone would have them with the changes under test, without ``.git``."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        timeout=60,
        check=False,
    )
    if listed.returncode != 0:
        pytest.skip(f"not a git checkout: {listed.stderr.decode().strip()}")
    for name in sorted(set(listed.stdout.decode().split("\0")) - {""}):
        source = REPO / name
        if source.is_file() or source.is_symlink():  # a deleted file is still listed
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name, follow_symlinks=False)
    return dest


def _programs(bin_dir: Path, calls: Path, *, hidden: tuple[str, ...], apt_get: str) -> str:
    """A PATH of one directory: every program of /usr/bin and /bin but ``hidden`` (what a
    missing Debian package would provide), and stand-ins for sudo and apt-get."""
    bin_dir.mkdir()
    for system in (Path("/usr/bin"), Path("/bin")):
        for program in system.iterdir():
            if program.name not in hidden and not (bin_dir / program.name).exists():
                (bin_dir / program.name).symlink_to(program)
    for name, text in (("sudo", _MUST_NOT_RUN), ("apt-get", apt_get)):
        (bin_dir / name).unlink(missing_ok=True)
        (bin_dir / name).write_text(text.format(calls=calls))
        (bin_dir / name).chmod(0o755)
    return str(bin_dir)


def _as_nobody(*argv: str) -> list[str]:
    """``argv`` run as ``nobody`` with no supplementary group (through ``sh``: setpriv would
    exec it still holding root's capabilities)."""
    uid, gid = as_nobody.ids()
    drop = ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--"]
    return [*drop, "sh", "-c", 'exec "$0" "$@"', *argv]


def _chown_tree(root: Path, uid: int, gid: int) -> None:
    for item in (root, *root.rglob("*")):
        os.lchown(item, uid, gid)


@pytest.mark.parametrize("target", ["install", "demo"])
def test_make_as_a_user_names_the_missing_build_packages_and_calls_no_sudo(target: str) -> None:
    """Issue 31 item 3: ``make install`` or ``make demo`` run by an unprivileged user (nobody)
    on a machine without gcc and pkg-config names exactly those packages and the command that
    installs them, and stops (make's exit 2) having called neither sudo nor apt-get, built no
    venv and installed nothing. Before, it called ``sudo apt-get install`` with fifteen
    packages, zsh, fish, strace and tmux among them."""
    uid, gid = as_nobody.ids()
    with as_nobody.workspace("memstaged-deps-") as base:
        work = _copy_of_repo(base / "clone")
        calls = base / "calls"
        calls.write_text("")
        path = _programs(base / "bin", calls, hidden=("gcc", "pkg-config"), apt_get=_MUST_NOT_RUN)
        _chown_tree(base, uid, gid)
        made = subprocess.run(
            _as_nobody("make", target, f"PREFIX={base}/prefix"),
            env={"PATH": path, "HOME": str(base), "LANG": "C.UTF-8"},
            cwd=work,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert made.returncode == 2, made.stdout + made.stderr
        assert made.stderr.splitlines()[:2] == [
            "memstaged needs these Debian packages: gcc pkg-config",
            "install them, then run make again: sudo apt-get install gcc pkg-config",
        ]
        assert calls.read_text() == ""
        assert not (work / ".venv").exists()
        assert not (base / "prefix").exists()


def test_make_as_root_installs_only_the_missing_build_packages(tmp_path: Path) -> None:
    """Issue 31 item 3: run as root (CI, a container), ``make install`` installs the missing
    build packages, and only those, with apt-get (never sudo). apt-get is a stand-in that fails
    the install: real packages cannot be taken away here to be installed back."""
    if os.geteuid() != 0:
        pytest.skip("make calls apt-get only as root; this test runs as non-root")
    work = _copy_of_repo(tmp_path / "clone")
    calls = tmp_path / "calls"
    calls.write_text("")
    apt_get = _APT_GET_FOR_ROOT
    path = _programs(tmp_path / "bin", calls, hidden=("gcc", "pkg-config"), apt_get=apt_get)
    made = subprocess.run(
        ["make", "install", f"PREFIX={tmp_path}/prefix"],
        env={"PATH": path, "HOME": str(tmp_path), "LANG": "C.UTF-8"},
        cwd=work,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert made.returncode == 2, made.stdout + made.stderr
    assert made.stdout.splitlines()[0] == "installing Debian packages: gcc pkg-config"
    assert calls.read_text().splitlines() == [
        "apt-get update -qq",
        "apt-get install -y -qq gcc pkg-config",
    ]
    assert not (work / ".venv").exists()


def test_an_unprivileged_user_runs_make_install_without_sudo() -> None:
    """Issue 31 item 3, for real: with the build packages present and the tests' tools absent
    (no zsh, fish, strace, tmux, node), an unprivileged user (nobody) runs ``make install
    PREFIX=...`` on a copy of the repository (no ``.git``, as in a tarball): the venv is built
    (systemd-python compiled, about 45 s), memstaged is linked into PREFIX/bin and runs, saying
    the version of a build without git (pyproject.toml's fallback), and neither sudo nor apt-get
    was called (stand-ins that fail loudly). Before, make called sudo for the tests' tools."""
    uid, gid = as_nobody.ids()
    with as_nobody.workspace("memstaged-install-") as base:
        work = _copy_of_repo(base / "clone")
        calls = base / "calls"
        calls.write_text("")
        tests_only = ("zsh", "fish", "strace", "tmux", "node")
        path = _programs(base / "bin", calls, hidden=tests_only, apt_get=_MUST_NOT_RUN)
        (base / "home").mkdir()
        _chown_tree(base, uid, gid)
        env = {
            "PATH": path,
            "HOME": str(base / "home"),
            "LANG": "C.UTF-8",
            **{k: v for k, v in os.environ.items() if k.startswith("PIP_")},
        }
        checked = subprocess.run(
            _as_nobody("sh", "packaging/debian-deps", "build"),
            env=env,
            cwd=work,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if checked.returncode != 0:
            pytest.skip(f"the build packages are not all here: {checked.stderr.strip()}")
        made = subprocess.run(
            _as_nobody("make", "install", f"PREFIX={base}/prefix"),
            env=env,
            cwd=work,
            capture_output=True,
            text=True,
            timeout=1200,
            check=False,
        )
        assert made.returncode == 0, made.stdout[-3000:] + made.stderr[-3000:]
        assert calls.read_text() == ""
        assert f"memstaged is {base}/prefix/bin/memstaged" in made.stdout.splitlines()
        assert not (work / ".venv" / "bin" / "pytest").exists()  # the runtime only
        ran = subprocess.run(
            _as_nobody(f"{base}/prefix/bin/memstaged", "--version"),
            env=env,
            cwd=base,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        fallback = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools_scm"]
        assert (ran.returncode, ran.stdout) == (0, f"memstaged {fallback['fallback_version']}\n")


def test_the_readme_names_the_packages_make_checks_for() -> None:
    """Issue 31 item 3: the table of Debian packages (docs/install.md) says exactly what
    ``packaging/debian-deps`` checks for and installs: the build packages (``make install``,
    ``make demo``) and, for ``make test``, those and the tests' tools; the README's Install line
    installs pipx and the build packages."""

    def listed(which: str) -> list[str]:
        return subprocess.run(
            ["sh", str(REPO / "packaging" / "debian-deps"), "list", which],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout.split()

    table = (REPO / "docs" / "install.md").read_text()
    build = re.search(
        r"^\| `make demo`, `make install`.*?the build packages: `([^`]+)`", table, re.M
    )
    test = re.search(r"^\| `make test`, .*? those, and `([^`]+)`", table, re.M)
    assert build is not None and test is not None
    assert build.group(1).split() == listed("build")
    assert build.group(1).split() + test.group(1).split() == listed("test")
    for doc in ("README.md", "docs/install.md"):  # the Install sections' line
        assert f"sudo apt-get install pipx {build.group(1)}" in (REPO / doc).read_text(), doc


# -- the build ----------------------------------------------------------------------------------


def test_the_build_prints_no_deprecation_warning(tmp_path: Path) -> None:
    """Issue 22 item 10: building the package (as pipx and ``make setup`` do, in an isolated
    build environment with a current setuptools) prints no deprecation warning, and the wheel
    declares its licence as the SPDX expression ``MIT``."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    shutil.copytree(
        REPO / "memstaged", src / "memstaged", ignore=shutil.ignore_patterns("__pycache__")
    )
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-v",
            "--no-deps",
            "-w",
            str(tmp_path / "out"),
            str(src),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    output = built.stdout + built.stderr
    assert not re.findall(r".*(?:Deprecat|deprecated).*", output), output[-3000:]
    (wheel,) = (tmp_path / "out").glob("memstaged-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = zf.read(name).decode()
    assert "License-Expression: MIT" in metadata.splitlines()


# -- the version, from git, and the release files ----------------------------------------------

#: git for the test's own repositories: no user or system configuration, a fixed committer.
_GIT_ENV: Final = {
    "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
    "HOME": "/nonexistent",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_AUTHOR_NAME": "memstaged tests",
    "GIT_AUTHOR_EMAIL": "tests@memstaged.invalid",
    "GIT_COMMITTER_NAME": "memstaged tests",
    "GIT_COMMITTER_EMAIL": "tests@memstaged.invalid",
}


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args],
        env=_GIT_ENV,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.strip()


def _tagged_repo(dest: Path, tag: str) -> Path:
    """A git repository of this working tree's files, in one commit tagged ``tag`` (annotated,
    as a release tag is); ``.venv`` is ignored in it, as a clone's own venv would be."""
    _copy_of_repo(dest)
    _git(dest, "init", "-q", "-b", "main")
    _git(dest, "add", "-A")
    _git(dest, "commit", "-q", "-m", "the tree under test")
    _git(dest, "tag", "-a", tag, "-m", tag)
    (dest / ".git" / "info" / "exclude").write_text(".venv\n")
    return dest


def _built_wheel(src: Path, out: Path) -> Path:
    """The wheel pip builds of ``src`` (as pipx does, in an isolated build environment)."""
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(src)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    (wheel,) = out.glob("memstaged-*.whl")
    return wheel


def _version_of_installed(wheel: Path, venv: Path) -> str:
    """What ``memstaged --version`` prints once ``wheel`` is installed in a new venv."""
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120
    )
    python = str(venv / "bin" / "python")
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", str(wheel)],
        check=True,
        timeout=300,
    )
    shown = subprocess.run(
        [str(venv / "bin" / "memstaged"), "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (shown.returncode, shown.stderr) == (0, ""), shown.stderr
    return shown.stdout


def test_version_is_the_commit_git_describe_names(tmp_path: Path) -> None:
    """Issue 31 item 13: built from a clone one commit after the tag v0.2.0, ``memstaged
    --version`` says what ``git describe`` derives: the next version, a development release
    counting the commits since the tag, and the commit (``0.2.1.dev1+g<hash>``); a ``git
    archive`` tarball of that commit (no ``.git``) builds with the same version. Before, every
    build said 0.1.0."""
    repo = _tagged_repo(tmp_path / "repo", "v0.2.0")
    _git(repo, "commit", "-q", "--allow-empty", "-m", "one commit after the release")
    described = _git(repo, "describe", "--tags", "--long")
    found = re.fullmatch(r"v(\d+)\.(\d+)\.(\d+)-(\d+)-g[0-9a-f]+", described)
    assert found is not None, described
    major, minor, patch, distance = (int(n) for n in found.groups())
    expected = f"memstaged {major}.{minor}.{patch + 1}.dev{distance}+g"
    head = _git(repo, "rev-parse", "HEAD")

    def names_head(shown: str) -> bool:
        """``expected`` and then at least 7 leading digits of HEAD's hash."""
        node = shown.removeprefix(expected).removesuffix("\n")
        return shown == f"{expected}{node}\n" and len(node) >= 7 and head.startswith(node)

    shown = _version_of_installed(_built_wheel(repo, tmp_path / "w1"), tmp_path / "v1")
    assert expected == "memstaged 0.2.1.dev1+g"
    assert names_head(shown), shown

    archive = tmp_path / "archive"
    archive.mkdir()
    tar = subprocess.run(
        ["git", "-C", str(repo), "archive", "--format=tar", "HEAD"],
        env=_GIT_ENV,
        capture_output=True,
        timeout=60,
        check=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(archive)], input=tar, check=True, timeout=60)
    assert not (archive / ".git").exists()
    from_archive = _built_wheel(archive, tmp_path / "w2")
    shown = _version_of_installed(from_archive, tmp_path / "v2")
    assert names_head(shown), shown  # git archive's hash may be shorter


def test_version_is_the_installed_distributions_read_only_when_asked(tmp_path: Path) -> None:
    """Issue 31 item 13: ``memstaged --version`` prints the installed distribution's version
    (importlib.metadata: what the build took from git), not a constant; a command that does
    not ask for it does not load importlib.metadata (milliseconds of every start-up)."""
    shown = subprocess.run(
        [str(MEMSTAGED), "--version"], capture_output=True, text=True, timeout=60, check=False
    )
    assert (shown.returncode, shown.stdout) == (0, f"memstaged {metadata.version('memstaged')}\n")
    probe = (
        "import sys\n"
        "from memstaged.cli.main import main\n"
        "code = main(['config', 'check', '--config', sys.argv[1]])\n"
        "print(code, 'importlib.metadata' in sys.modules)\n"
    )
    (tmp_path / "config.toml").write_text("settle = 1\n")
    loaded = subprocess.run(
        [sys.executable, "-c", probe, str(tmp_path / "config.toml")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert loaded.stdout.splitlines()[-1] == "0 False", loaded.stdout + loaded.stderr


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """``make dist`` on a repository of this working tree whose commit is tagged v0.2.0, with
    this venv as its ``.venv``: the repository and what make printed."""
    repo = _tagged_repo(tmp_path_factory.mktemp("release") / "repo", "v0.2.0")
    (repo / ".venv").symlink_to(REPO / ".venv")
    made = subprocess.run(
        ["make", "-o", ".venv/.installed", "-o", "builddeps", "dist"],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert made.returncode == 0, made.stdout[-3000:] + made.stderr[-3000:]
    return repo, re.sub(r"\x1b\[[0-9;]*m", "", made.stdout)  # twine colours PASSED


#: Where the wheel puts each generated file: in the package (what ``completion --install`` and
#: ``service install`` read) and under the prefix's share/ (where pipx links the man page from).
_IN_THE_WHEEL: Final = {
    "memstaged/data/memstaged.service": "memstaged/data/memstaged.service",
    "memstaged/data/man/memstaged.1": "memstaged/data/man/memstaged.1",
    "memstaged/data/completions/bash/memstaged": "memstaged/data/completions/bash/memstaged",
    "memstaged/data/completions/zsh/_memstaged": "memstaged/data/completions/zsh/_memstaged",
    "memstaged/data/completions/fish/memstaged.fish": (
        "memstaged/data/completions/fish/memstaged.fish"
    ),
    "memstaged-0.2.0.data/data/share/man/man1/memstaged.1": "memstaged/data/man/memstaged.1",
    "memstaged-0.2.0.data/data/share/bash-completion/completions/memstaged": (
        "memstaged/data/completions/bash/memstaged"
    ),
    "memstaged-0.2.0.data/data/share/zsh/site-functions/_memstaged": (
        "memstaged/data/completions/zsh/_memstaged"
    ),
    "memstaged-0.2.0.data/data/share/fish/vendor_completions.d/memstaged.fish": (
        "memstaged/data/completions/fish/memstaged.fish"
    ),
}


def test_make_dist_on_the_release_tag_makes_a_wheel_and_sdist_twine_passes(
    release: tuple[Path, str],
) -> None:
    """Issue 31 item 14: ``make dist`` on the commit tagged v0.2.0 leaves exactly the wheel and
    the sdist of version 0.2.0 in dist/, and ``twine check --strict`` passes both. The wheel,
    built from the sdist (so the sdist is complete), carries the unit, the man page and the three
    completion scripts, byte for byte; the sdist's PKG-INFO says 0.2.0."""
    repo, printed = release
    dist = repo / "dist"
    wheel, sdist = dist / "memstaged-0.2.0-py3-none-any.whl", dist / "memstaged-0.2.0.tar.gz"
    assert sorted(dist.iterdir()) == [wheel, sdist]
    for built in (wheel, sdist):
        assert f"Checking dist/{built.name}: PASSED" in printed.splitlines(), printed
    with zipfile.ZipFile(wheel) as zf:
        for member, source in _IN_THE_WHEEL.items():
            assert zf.read(member) == (REPO / source).read_bytes(), member
        metadata = zf.read("memstaged-0.2.0.dist-info/METADATA").decode().splitlines()
    assert "Version: 0.2.0" in metadata
    assert "License-Expression: MIT" in metadata
    with tarfile.open(sdist) as tf:
        info = tf.extractfile("memstaged-0.2.0/PKG-INFO")
        assert info is not None
        assert "Version: 0.2.0" in info.read().decode().splitlines()
        names = set(tf.getnames())
    assert {"memstaged-0.2.0/memstaged/data/memstaged.service", "memstaged-0.2.0/Makefile"} <= names


# -- pipx install of the release wheel, as the README says, on a fresh account -------------------


def _pipx(env: dict[str, str], *args: str) -> str:
    """``pipx ARGS`` (this venv's pipx) with ``env``: what it printed, after a success."""
    ran = subprocess.run(
        [sys.executable, "-m", "pipx", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    output = ran.stdout + ran.stderr
    assert ran.returncode == 0, output[-3000:]
    return " ".join(output.split())


@pytest.mark.slow
@pytest.mark.systemd
def test_pipx_install_of_the_release_wheel_gives_the_service_man_page_and_completion(
    release: tuple[Path, str], clone: Path
) -> None:
    """Issue 31 items 12 and 14 (issue 22 items 6 and 9), the README's path from the release
    wheel, on a fresh account (home from /etc/skel) with a real user manager:

    - after ``make install``, ``pipx install WHEEL`` succeeds but warns "symlink missing" for
      memstaged and its page, which stay the clone's; the README's ``make uninstall`` then
      ``pipx reinstall memstaged`` make both pipx's;
    - pipx warns that ~/.local/bin is not on PATH (the README: ``pipx ensurepath``);
    - ``memstaged --version`` says 0.2.0, and ``man -w memstaged`` finds the page pipx linked
      from the wheel;
    - ``memstaged completion --install`` makes a new ``bash -i`` complete ``memstaged dead<Tab>``;
    - ``memstaged service install --enable`` runs pipx's memstaged as the service (the unit
      from the wheel), which quarantines a broken staging file.

    Slow: pipx builds systemd-python from source."""
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    if not Path("/usr/share/bash-completion/bash_completion").is_file():
        pytest.skip("bash-completion is not installed (make sysdeps installs it)")
    repo, _ = release
    wheel = repo / "dist" / "memstaged-0.2.0-py3-none-any.whl"
    with user_systemd() as sd:
        home = sd.home
        shutil.copytree("/etc/skel", home, dirs_exist_ok=True)
        bare = {  # a login before pipx ensurepath: ~/.local/bin is not on PATH
            "HOME": str(home),
            "USER": sd.env["USER"],
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "LANG": "C.UTF-8",
            **{k: v for k, v in os.environ.items() if k.startswith("PIP_")},
        }
        link = home / ".local" / "bin" / "memstaged"
        page = home / ".local" / "share" / "man" / "man1" / "memstaged.1"
        pipx_venv = home / ".local" / "share" / "pipx" / "venvs" / "memstaged"

        assert _make(clone, None, "install", env=bare).returncode == 0
        said = _pipx(bare, "install", str(wheel))
        assert "memstaged (symlink missing or pointing to unexpected location)" in said
        assert "man1/memstaged.1 (symlink missing or pointing to unexpected location)" in said
        assert os.readlink(link) == f"{clone}/.venv/bin/memstaged"
        assert _make(clone, None, "uninstall", env=bare).returncode == 0
        said = _pipx(bare, "reinstall", "memstaged")
        assert "symlink missing" not in said
        assert "is not on your PATH environment variable" in said
        assert "pipx ensurepath" in said  # what the README tells to run, then a new shell
        assert os.readlink(link) == f"{pipx_venv}/bin/memstaged"

        env = {
            **bare,
            "PATH": f"{home}/.local/bin:{bare['PATH']}",
            "TERM": "xterm-256color",
            "PAGER": "less",
            "MANPAGER": "less",
        }
        version = subprocess.run(
            ["memstaged", "--version"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert (version.returncode, version.stdout) == (0, "memstaged 0.2.0\n")
        where = subprocess.run(
            ["man", "-w", "memstaged"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        # man names the page pipx linked there from the wheel by where the link leads.
        assert os.readlink(page) == f"{pipx_venv}/share/man/man1/memstaged.1"
        assert where.stdout.strip() == os.readlink(page), where.stderr
        assert _pressed_tab(home, env, install=True) == "memstaged deadletter X"

        mdir = home / "src" / "project" / ".pi" / "memory" / "project"
        (mdir / "staging").mkdir(parents=True)
        broken = mdir / "staging" / "broken.json"
        broken.write_bytes(b"{nope")
        os.utime(broken, (1e9, 1e9))  # long finished, not being written
        config = Path(sd.env["XDG_CONFIG_HOME"]) / "memstaged" / "config.toml"
        config.parent.mkdir(parents=True)
        config.write_text(f'memory_dirs = ["{mdir}"]\n')
        installed = sd.run(str(link), "service", "install", "--enable", timeout=120)
        assert installed.returncode == 0, installed.stdout + installed.stderr
        unit = (sd.unit_dir / "memstaged.service").read_text().splitlines()
        assert f"ExecStart={pipx_venv}/bin/memstaged" in unit
        assert sd.systemctl("is-active", "memstaged.service").stdout.strip() == "active"
        wait_until(lambda: not broken.exists(), timeout=60, what="the service's quarantine")
        [original] = (mdir / "deadletter" / "originals").iterdir()
        assert original.name.startswith("broken.json.")
        assert original.read_bytes() == b"{nope"
