"""``memstaged help [COMMAND [ACTION]]``: the same text as ``memstaged [COMMAND [ACTION]] --help``,
as ``git help`` and ``systemctl help`` give it."""

from __future__ import annotations

import argparse
from typing import Any

from memstaged.errors import UsageError


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "help",
        help="show the help of memstaged, of a command or of one of its actions",
        description="Show what 'memstaged [COMMAND [ACTION]] --help' shows.",
    )
    parser.add_argument(
        "words", nargs="*", metavar="COMMAND", help="a command, and an action of it"
    )
    parser.set_defaults(func=_help)


def _help(args: argparse.Namespace) -> int:
    from memstaged.cli.main import build_parser

    words: list[str] = list(args.words)
    if any(word.startswith("-") for word in words):
        raise UsageError(f"help takes command names, not options: {' '.join(words)}")
    parser = build_parser(None)
    known = parser
    for depth, word in enumerate(words):
        actions = [a for a in known._actions if isinstance(a, argparse._SubParsersAction)]
        choices: dict[str, argparse.ArgumentParser] = actions[0].choices if actions else {}
        listed = [a.dest for a in actions[0]._choices_actions] if actions else []
        if word not in listed:
            where = " ".join(["memstaged", *words[:depth]])
            names = ", ".join(sorted(listed)) or "none"
            raise UsageError(f"'{word}' is not a command of {where} (its commands: {names})")
        known = choices[word]
    known.print_help()
    return 0
