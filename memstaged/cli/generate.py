"""Shell completions and the man page, generated from the real argparse parser.

``python -m memstaged.cli.generate`` (``make completions``) writes them under ``memstaged/data/``,
from where the package installs them (``pyproject.toml``'s data files: bash-completion, zsh and
fish look there under ``share/``; man under ``share/man/man1``). Nothing is written by hand:
shtab turns the parser into completion scripts and argparse-manpage into roff, so a new option
is completed and documented as soon as the files are generated again, and a test fails while
the committed files differ from what the parser gives (``tests/cli/test_completions.py``).

shtab and argparse-manpage are needed only to generate (the ``dev`` extra), not to run.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Final

from memstaged.files import atomic_write

DATA: Final = Path(__file__).parents[1] / "data"
#: Where each file goes under ``data/`` (the data files of pyproject.toml name the same).
FILES: Final = {
    "bash": "completions/bash/memstaged",
    "zsh": "completions/zsh/_memstaged",
    "fish": "completions/fish/memstaged.fish",
    "man": "man/memstaged.1",
}
#: The man page's version and date: the release's, not the build's or the day it was generated
#: (reproducible files; ``--version`` names the build).
RELEASE: Final = "0.2.0"
RELEASE_DATE: Final = "2026-12-04"


def _parser() -> Any:
    from memstaged.cli.main import build_parser

    return build_parser()


def _drop_hidden(parser: Any) -> None:
    """Remove the subcommands added without help (``deadletter ids``, for the completion
    scripts only) from ``parser``, as shtab leaves them out: argparse-manpage would document
    them, since it hides only a help of ``SUPPRESS``, which argparse of Python 3.11 prints."""
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            public = {choice.dest for choice in action._choices_actions}
            for name in [n for n in action.choices if n not in public]:
                del action.choices[name]
            for sub in action.choices.values():
                _drop_hidden(sub)


def render() -> dict[str, str]:
    """Every generated file's text, by the key of :data:`FILES`, formatted for 80 columns
    whatever the terminal (argparse reads ``COLUMNS`` when it formats help)."""
    import shtab
    from argparse_manpage.manpage import Manpage

    from memstaged.cli.manpage import sections

    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "80"
    try:
        parser = _parser()
        out = {shell: shtab.complete(parser, shell=shell) for shell in ("bash", "zsh", "fish")}
        # Both in DESCRIPTION, in this order: the epilog is not "COMMENTS".
        about = [parser.description, parser.epilog]
        parser.description = parser.epilog = None
        _drop_hidden(parser)
        page = Manpage(parser, format="single-commands-section")
        page.date = RELEASE_DATE
        page.source = f"memstaged {RELEASE}"
        page.manual = "memstaged manual"
        page.description = "validate, repair or quarantine agent-memory staging files"
        for heading, content in sections(about).items():
            page.add_section(heading, "=", content)
        out["man"] = str(page)
    finally:
        if saved is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = saved
    return out


def main() -> int:
    for key, text in render().items():
        path = DATA / FILES[key]
        atomic_write.replace_file(path, text.encode(), mode=0o644, parents=True)
        sys.stdout.write(f"wrote {path}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
