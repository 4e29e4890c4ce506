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
