"""The private directories memstaged keeps its own files in (:mod:`memstaged.files.private_dirs`):
used only when they are the user's own and private, as ssh refuses a directory that is not.

Another user is the real ``nobody``: a directory it owns is made with ``os.chown`` (as root).
The commands and the daemon refusing such directories are in
``tests/system/test_private_dirs_processes.py``."""

from __future__ import annotations

import os
import pwd
import stat
from pathlib import Path

import pytest
from support import as_nobody

from memstaged.errors import NotPrivate
from memstaged.files import private_dirs

REFUSED = "bad ownership or modes for directory"


# -- private directories ---------------------------------------------------------------------------


def test_a_missing_directory_is_made_private_with_its_parents(tmp_path: Path) -> None:
    """Issue 29 item 11: what does not exist yet is made 0700, parents included, and passes."""
    target = tmp_path / "a" / "b" / "memstaged"
    assert private_dirs.private_dir(target, create=False) is False
    assert not target.exists()
    assert private_dirs.private_dir(target) is True
    for path in (tmp_path / "a", tmp_path / "a" / "b", target):
        assert stat.S_IMODE(path.stat().st_mode) == 0o700


@pytest.mark.parametrize("mode", [0o755, 0o750, 0o701, 0o705])
def test_the_users_own_directory_others_may_only_read_is_made_private(
    tmp_path: Path, mode: int
) -> None:
    """Issue 29 item 11: the user's own directory that group or others may read or enter, but
    not write (a state dir an earlier version left 0755), is made 0700 and used: no one else
    can have put anything in it."""
    target = tmp_path / "memstaged"
    target.mkdir()
    os.chmod(target, mode)
    assert private_dirs.private_dir(target)
    assert stat.S_IMODE(target.stat().st_mode) == 0o700


@pytest.mark.parametrize("mode", [0o775, 0o770, 0o703, 0o777])
def test_a_directory_others_may_write_is_refused_in_one_line(tmp_path: Path, mode: int) -> None:
    """Issue 29 item 11: the user's own directory that group or others may write into is
    refused, naming the directory, its owner and its mode (as ssh's "bad ownership or modes")."""
    target = tmp_path / "memstaged"
    target.mkdir()
    os.chmod(target, mode)
    with pytest.raises(NotPrivate) as refused:
        private_dirs.private_dir(target)
    me = pwd.getpwuid(os.geteuid()).pw_name
    assert refused.value.strerror == (
        f"{REFUSED} {target} (owner {me}, mode {mode:04o}): it must be {me}'s own, mode 0700"
    )


def test_a_link_and_another_users_directory_are_refused(tmp_path: Path) -> None:
    """Issue 29 item 11: a symbolic link to a private directory, and a private directory of
    another user, are refused."""
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(NotPrivate, match=f"{REFUSED} {tmp_path / 'link'}: a symbolic link"):
        private_dirs.private_dir(tmp_path / "link")
    uid = as_nobody.owner_ids()[0]
    theirs = as_nobody.made_by(tmp_path / "theirs", uid, 0o700)
    with pytest.raises(NotPrivate, match=r"\(owner nobody, mode 0700\)"):
        private_dirs.private_dir(theirs)
