"""The way to the state dir: another user can make it lead elsewhere neither through a
directory they may write nor through a link they own (docs/reliability.md).

Another user is the real ``nobody``: what it owns is given to it with ``os.chown`` (as root)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from support import as_nobody
from support.commands import one_line_error, run

from memstaged import config

pytestmark = pytest.mark.usefixtures("plain_output")


@pytest.mark.parametrize("argv", [["status"], ["--once"]], ids=" ".join)
def test_a_link_another_user_owns_on_the_way_is_refused(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    memory_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    argv: list[str],
) -> None:
    """Issue 29 D3: ``XDG_STATE_HOME`` named a link that ``nobody`` owns, pointing to the
    user's own directory. The directories above its target were checked and passed; the link
    was not, and ``nobody`` could point it elsewhere while a daemon ran: the instance lock and
    the marks were then looked for in another directory (a ``--once`` ran beside the daemon).
    The link is refused in one line, as a directory that user owns is."""
    uid, _gid = as_nobody.ids()
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "state-home"
    link.symlink_to(real)
    os.lchown(link, uid, uid)
    monkeypatch.setenv("XDG_STATE_HOME", str(link))
    code, out, err = run(capsys, *argv, "--memory-dir", str(memory_dir))
    assert (code, out) == (2, "")
    assert one_line_error(err) == (
        f"memstaged: state dir: bad ownership for link {link} on the way to "
        f"{link / 'memstaged'} (owner nobody): another user could make it lead elsewhere"
    )
    assert list(real.iterdir()) == []


def test_the_users_own_link_on_the_way_is_followed_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 29 D3: a link of the user's own on the way is followed, once, when the settings
    are made: the state dir used from then on is the directory it led to."""
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "state-home"
    link.symlink_to(real)
    settings = config.load(env={"XDG_STATE_HOME": str(link), "HOME": str(tmp_path)})
    assert settings.state_dir == real / "memstaged"
    assert config.own_state_dir(settings) == real / "memstaged"
    assert (real / "memstaged").is_dir()


@pytest.mark.parametrize("way", ["link-then-up", "up-past-a-missing-dir"])
def test_the_way_checked_is_the_way_the_kernel_takes(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    memory_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    way: str,
) -> None:
    """Issue 29 D3, attacked again: the check read ``ll/..`` as text (gone) where the kernel
    follows ``ll`` and goes up from its target, into a directory ``nobody`` may write; and a
    link through a missing directory and ``..`` passed the check, while the state dir was then
    made where the text led. Both are refused in one line, and nothing is made in nobody's
    directory."""
    uid, gid = as_nobody.ids()
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sub").mkdir()
    os.chown(theirs, uid, gid)
    os.chmod(theirs, 0o777)  # noqa: S103 - what nobody made
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    if way == "link-then-up":
        (mine / "ll").symlink_to(theirs / "sub")
        state_home = f"{mine}/ll/.."
    else:
        (mine / "kl").symlink_to(f"{mine}/nothere/../../theirs")
        state_home = str(mine / "kl")
    monkeypatch.setenv("XDG_STATE_HOME", state_home)
    code, out, err = run(capsys, "status", "--memory-dir", str(memory_dir))
    assert (code, out) == (2, "")
    line = one_line_error(err)
    assert line.startswith("memstaged: state dir"), line
    assert sorted(p.name for p in theirs.iterdir()) == ["sub"]
