"""The man page's sections beyond what argparse knows: exit status, signals, files, environment,
configuration keys, examples.

argparse-manpage makes NAME, SYNOPSIS, DESCRIPTION and OPTIONS from the parser; these sections
are added to the same generated page (:mod:`memstaged.cli.generate`). Their text is the docs' own:
the exit codes are the CLI's (``check``'s table is
:data:`memstaged.cli.commands.check.EXIT_MEANINGS`, which its ``--help`` prints too), the
configuration keys and their comments are read from
``config.example.toml``, and the rest is condensed from README.md, docs/daemon.md and
docs/inspection.md. Only used at generation time, from a checkout.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Final

REPO: Final = Path(__file__).resolve().parents[2]
CONFIG_EXAMPLE: Final = REPO / "config.example.toml"

#: (variable, what it does), from config.example.toml, README.md and docs/inspection.md.
ENVIRONMENT: Final = (
    (
        "MEMSTAGED_CONFIG",
        "The config file, instead of $XDG_CONFIG_HOME/memstaged/config.toml "
        "(--config overrides it).",
    ),
    ("MEMSTAGED_MEMORY_DIRS", 'The memory dirs, ":"-separated; globs and ~ allowed (memory_dirs).'),
    ("MEMSTAGED_SETTLE", "Seconds a file that does not parse must stay unchanged (settle)."),
    ("MEMSTAGED_SPLIT_INVALID_CANDIDATES", "true or false (split_invalid_candidates)."),
    ("MEMSTAGED_OBSERVER", "auto, inotify or polling (observer)."),
    ("MEMSTAGED_LOG_FILE", "The JSON-lines decision log (log_file)."),
    ("MEMSTAGED_METRICS_FILE", "Where the daemon writes its Prometheus metrics (metrics_file)."),
    (
        "MEMSTAGED_WORKERS",
        "Decider processes for a --once batch of 256 files or more, 0 to 64 "
        "(default: one per CPU it may use, none on one CPU; 0: decide in one process).",
    ),
    (
        "MEMSTAGED_PAGER",
        "The pager of log and deadletter list on a terminal, before $PAGER "
        "(else less -FRSX); empty or cat: none.",
    ),
    ("NO_COLOR", "Set to any value: no colour, whatever the terminal."),
    ("XDG_CONFIG_HOME", "Where the config file and the systemd user unit go (~/.config)."),
    (
        "XDG_STATE_HOME",
        "Where the decision log, the seen cache, the ack marks and the instance locks go "
        "(~/.local/state; a relative path is ignored). The state dir and every directory and "
        "link on the way to it must be the user's or root's, and writable by no one else.",
    ),
    (
        "XDG_DATA_HOME",
        "Where completion --install writes the completions and this page (~/.local/share).",
    ),
)

#: (path, what it is), from README.md, docs/daemon.md and config.example.toml.
FILES: Final = (
    (
        "~/.config/memstaged/config.toml",
        "The configuration ($XDG_CONFIG_HOME; --config, MEMSTAGED_CONFIG). See CONFIGURATION.",
    ),
    (
        "~/.local/state/memstaged/decisions.jsonl",
        "The decision log, JSON lines, rotated at "
        "log_max_bytes with log_backups backups ($XDG_STATE_HOME; log_file).",
    ),
    (
        "~/.local/state/memstaged/seen",
        "The seen cache: which file versions were decided, so a restart does not read them again.",
    ),
    (
        "~/.config/systemd/user/memstaged.service",
        "The user unit that service install writes "
        "(and memstaged.service.d/sandbox.conf with --sandbox).",
    ),
    (
        "PROJECT/.pi/memory/project/staging/",
        "The staging files memstaged decides (a memory dir "
        "is a directory with a staging/ subdirectory).",
    ),
    (
        "PROJECT/.pi/memory/project/deadletter/",
        "Quarantined files: one record per candidate, "
        "and the original's exact bytes in originals/. Only deadletter recover and deadletter "
        "purge --yes remove records; nothing removes them on uninstall.",
    ),
    (
        "PROJECT/.pi/memory/project/canonical-writer.lock",
        "The reconciler's lock: while it "
        "names a live process, memstaged changes nothing in that memory dir.",
    ),
)

SIGNALS: Final = (
    (
        "SIGTERM, SIGINT",
        "Stop: the file being decided gets 0.5 s to finish (its decision is "
        "then durable and logged), or is abandoned and decided by the next run; no other file is "
        "started; exit 0. --once stops at once: exit 130 on Ctrl-C, 143 on SIGTERM, with "
        "canonical-writer.lock released and temps left for the next run.",
    ),
    (
        "SIGHUP",
        "Reload the config between two files, keeping queued work; on a bad config the "
        "daemon keeps its settings and says so in its status (systemctl --user reload memstaged "
        "checks the config first, and fails on a bad one).",
    ),
)

#: (code, meaning) for memstaged itself (the daemon, --once) and every command.
EXIT_STATUS: Final = (
    ("0", "Every file got a decision (a quarantine is one); a command did what it was asked."),
    (
        "1",
        "Some file could not be decided (still being written, an I/O error, another "
        "memstaged busy on the memory dir; a memstaged daemon holding it decides its files "
        "itself: --once says so at once, and --wait does not wait for it); the daemon: "
        "memstaged is already running (another daemon holds every memory dir); status: "
        "something needs attention (status --check: 1 WARNING, 2 CRITICAL, 3 UNKNOWN); deadletter "
        "recover: some record stayed in the store; service install --enable: not started (no "
        "memory dir configured).",
    ),
    ("2", "A usage or configuration error: one line on stderr naming the option, file or key."),
    ("130", "Interrupted (Ctrl-C); what was under way is finished by the next run."),
)

#: (command, comment), from README.md and docs/inspection.md.
EXAMPLES: Final = (
    ("memstaged --once --dry-run", "decide and log, write nothing"),
    ("memstaged --memory-dir '~/src/*/.pi/memory/project'", "the daemon, in the foreground"),
    ("memstaged service install --enable", "the systemd user service"),
    ("memstaged config show", "each setting, its value and where it came from"),
    ("memstaged log --decision quarantined --since today --reasons", "what, when and why"),
    ("memstaged deadletter list", "one line per dead-letter record, its ID first"),
    ("memstaged deadletter recover --session ID --dry-run", "what would come back"),
    ("memstaged check --diff staging/FILE.json", "what --once would do with a file"),
    ("memstaged completion --install", "completions and this page, for this user"),
)

SLOW_WRITERS: Final = (
    "A writer that appends to a staging file in pieces, pausing longer than settle between "
    "them, has each piece that does not parse quarantined on its own (SPEC 5: a file that "
    "does not parse is decided once unchanged for settle seconds). For slow writers raise "
    "settle, or have them write a temp file and rename it into staging/ (memstaged never "
    "reads names starting with a dot)."
)


def roff(text: str) -> str:
    """Plain text as roff: backslashes and dashes escaped, no line taken for a request."""
    escaped = text.replace("\\", "\\e").replace("-", "\\-")
    return "\n".join(
        "\\&" + line if line.startswith((".", "'")) else line for line in escaped.splitlines()
    )


def _tagged(items: Iterable[tuple[str, str]]) -> str:
    """A ``.TP`` list: each term bold, as one macro argument (its quotes as ``\\(dq``)."""
    lines = []
    for term, text in items:
        quoted = roff(term).replace('"', "\\(dq")
        lines.append(f'.TP\n.B "{quoted}"\n{roff(text)}')
    return "\n".join(lines)


def config_keys(text: str) -> list[tuple[str, str]]:
    """(``key = default``, its comment) for each key of config.example.toml, in order: the
    comment lines just above a key, and a commented-out example below it, belong to it."""
    keys: list[tuple[str, str]] = []
    comment: list[str] = []
    for raw in text.split("\n\n", 1)[1].splitlines():  # the first paragraph is about the file
        line = raw.strip()
        if not line:
            comment = []
        elif line.startswith("# ") and re.match(r"# [\"\w]+ = ", line) and keys:
            keys[-1] = (keys[-1][0], f"{keys[-1][1]} Example: {line[2:]}".strip())
        elif line.startswith("#"):
            comment.append(line.lstrip("#").strip().replace("`", ""))
        elif line.startswith("["):
            keys.append((line, " ".join(comment)))
            comment = []
        else:
            keys.append((line, " ".join(comment)))
            comment = []
    return keys


def check_exit_codes() -> str:
    from memstaged.cli.commands.check import EXIT_MEANINGS

    return _tagged((str(code), meaning) for code, meaning in EXIT_MEANINGS)


def sections(about: Sequence[str | None] = ()) -> dict[str, str]:
    """Each extra section's roff, by heading, in the order the page shows them; ``about`` are
    the paragraphs of DESCRIPTION (the parser's description and epilog)."""
    from memstaged.cli.commands.completion import _EPILOG as COMPLETION

    config_text = CONFIG_EXAMPLE.read_text(encoding="utf-8")
    head = config_text.split("\n\n", 1)[0]
    file_about = " ".join(line.lstrip("#").strip() for line in head.splitlines())
    examples = _tagged(EXAMPLES)
    zsh = next(line for line in COMPLETION.splitlines() if "fpath=(" in line).strip()
    return {
        "description": "\n.PP\n".join(roff(text) for text in about if text),
        # .nh .ad l: no hyphenated names (MEMSTAGED_MEM-ORY_DIRS), no stretched spaces.
        "exit status": ".nh\n.ad l\n"
        + _tagged(EXIT_STATUS)
        + "\n.PP\ncheck exits with the worst code over all the files it is given:\n"
        + check_exit_codes(),
        "signals": _tagged(SIGNALS),
        "environment": _tagged(ENVIRONMENT),
        "files": _tagged(FILES)
        + "\n.PP\n"
        + roff(
            "memstaged completion --install also writes the bash, zsh and fish completions "
            "and this page under ~/.local/share (fish: ~/.config/fish/completions); for zsh, "
            + zsh
            + "."
        ),
        "configuration": roff(file_about.replace("`", ""))
        + "\n"
        + _tagged(config_keys(config_text)),
        "slow writers": roff(SLOW_WRITERS),
        "examples": examples,
        "see also": roff(
            "systemctl(1), journalctl(1); README.md, docs/daemon.md and docs/inspection.md "
            "in the source."
        ),
    }
