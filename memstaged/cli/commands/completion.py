"""``memstaged completion bash|zsh|fish`` and ``memstaged completion --install``.

The scripts and the man page are generated from the parser at build time (``make completions``,
:mod:`memstaged.cli.generate`) and shipped inside the package. ``pipx install`` and ``pip install``
put the package's data files under the venv's ``share/``, where no shell and no ``man`` looks, so
this command prints a script (as ``gh completion`` and ``kubectl completion`` do: ``source
<(memstaged completion bash)``), and ``--install`` copies all of them where bash-completion, zsh,
fish and man look for one user's files. Nothing here imports shtab or argparse-manpage: they are
needed to generate, not to run.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Final

from memstaged.errors import ConfigError, UsageError
from memstaged.files import atomic_write

#: Each shell's script inside the package (the keys of ``memstaged.cli.generate.FILES``).
SCRIPTS: Final = {
    "bash": "data/completions/bash/memstaged",
    "zsh": "data/completions/zsh/_memstaged",
    "fish": "data/completions/fish/memstaged.fish",
}
MAN_PAGE: Final = "data/man/memstaged.1"

_EPILOG: Final = """\
examples:
  source <(memstaged completion bash)     this shell only
  memstaged completion --install          every new shell, and man memstaged

--install writes, for this user only:
  bash  $XDG_DATA_HOME/bash-completion/completions/memstaged (~/.local/share/...;
        bash-completion loads it when memstaged is first completed)
  zsh   $XDG_DATA_HOME/zsh/site-functions/_memstaged: not in zsh's fpath by default;
        add  fpath=(~/.local/share/zsh/site-functions $fpath)  before compinit in ~/.zshrc
  fish  $XDG_CONFIG_HOME/fish/completions/memstaged.fish (~/.config/fish/...)
  man   $XDG_DATA_HOME/man/man1/memstaged.1: man finds it when ~/.local/bin is on PATH
Run it again after an upgrade: the files are copies of this version's.
"""


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "completion",
        help="print a shell completion script, or install them and the man page",
        description="Print the completion script of a shell, or with --install write the\n"
        "bash, zsh and fish scripts and the man page where they are found for this user.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("shell", nargs="?", choices=sorted(SCRIPTS), help="the shell")
    parser.add_argument(
        "--install",
        action="store_true",
        help="write every shell's script and the man page under ~/.local/share (see below)",
    )
    parser.set_defaults(func=run)


def packaged(name: str) -> str:
    """A generated file's text as this installation shipped it."""
    return resources.files("memstaged").joinpath(name).read_text(encoding="utf-8")


@dataclass(frozen=True)
class Target:
    """One installed file: what it is, where it goes, and the packaged file it copies."""

    what: str
    path: Path
    source: str


def targets(env: Mapping[str, str]) -> list[Target]:
    """Where bash-completion, zsh (with the ``fpath`` line above), fish and man-db look for one
    user's files, under ``$XDG_DATA_HOME`` (``~/.local/share``) and fish's ``$XDG_CONFIG_HOME``.

    bash-completion 2 looks in ``$BASH_COMPLETION_USER_DIR/completions`` or
    ``$XDG_DATA_HOME/bash-completion/completions``; man-db derives ``~/.local/share/man`` from
    ``~/.local/bin`` on PATH (its ``../share/man`` rule).
    """
    home = Path(env.get("HOME") or Path.home())
    data = Path(env.get("XDG_DATA_HOME") or home / ".local" / "share")
    conf = Path(env.get("XDG_CONFIG_HOME") or home / ".config")
    bash_dir = Path(env.get("BASH_COMPLETION_USER_DIR") or data / "bash-completion")
    return [
        Target("bash", bash_dir / "completions" / "memstaged", SCRIPTS["bash"]),
        Target("zsh", data / "zsh" / "site-functions" / "_memstaged", SCRIPTS["zsh"]),
        Target("fish", conf / "fish" / "completions" / "memstaged.fish", SCRIPTS["fish"]),
        Target("man", data / "man" / "man1" / "memstaged.1", MAN_PAGE),
    ]


def _write(path: Path, text: str) -> None:
    """Replace ``path`` (0644) in one rename, so a shell starting meanwhile reads a whole script."""
    try:
        atomic_write.replace_file(path, text.encode(), mode=0o644, parents=True)
    except OSError as err:
        raise ConfigError(f"cannot write {path}: {err.strerror}") from None


def install(env: Mapping[str, str]) -> list[Target]:
    """Copy every script and the man page to :func:`targets`; returns what was written."""
    written = []
    for target in targets(env):
        _write(target.path, packaged(target.source))
        written.append(target)
    return written


def run(args: argparse.Namespace) -> int:
    if args.install:
        if args.shell is not None:
            raise UsageError("memstaged completion: --install writes every shell's script")
        written = install(os.environ)
        for target in written:
            print(f"{target.what}: wrote {target.path}")
        zsh = next(t.path.parent for t in written if t.what == "zsh")
        home = Path(os.environ.get("HOME") or Path.home())
        shown = f"~/{zsh.relative_to(home)}" if zsh.is_relative_to(home) else str(zsh)
        print(
            f"zsh does not look in {shown} by default: add "
            f"'fpath=({shown} $fpath)' before compinit in ~/.zshrc"
        )
        print("new shells complete memstaged; man memstaged shows the page")
        return 0
    if args.shell is None:
        raise UsageError(
            "memstaged completion: name a shell (bash, zsh or fish), or --install "
            "(see memstaged completion --help)"
        )
    sys.stdout.write(packaged(SCRIPTS[args.shell]))
    return 0
