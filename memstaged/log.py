"""The decision log (SPEC section 7): one structlog event per decision, fanned out to three sinks.

* a JSON-lines file that memstaged rotates itself (``logging.handlers.RotatingFileHandler``), which
  the inspection commands read without journald;
* journald, every field as a ``MEMSTAGED_*`` journal field plus ``MESSAGE``, ``PRIORITY`` and a
  ``MESSAGE_ID`` per kind of event, when running under systemd;
* the terminal: readable on a TTY, JSON lines otherwise (and nothing when journald already has it,
  since systemd would store our stderr a second time).

Events are flat dicts of JSON values, so each key maps one to one onto a journal field.
"""

from __future__ import annotations

import json
import logging
import logging.handlers
import os
import sys
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any, Final

import msgspec
import structlog

LOGGER_NAME: Final = "memstaged"
JOURNAL_SOCKET: Final = "/run/systemd/journal/socket"

#: One MESSAGE_ID per kind of event, so ``journalctl MESSAGE_ID=...`` finds them all.
MESSAGE_IDS: Final = {
    "decision": "6f1c2a0d3b7e4f5a9c8d1e2f3a4b5c6d",
    "start": "0b9a5c3e7d2f4a1b8c6e9d0f1a2b3c4d",
    "ready": "1c2d3e4f5a6b4c7d8e9f0a1b2c3d4e5f",
    "reload": "2d3e4f5a6b7c4d8e9f0a1b2c3d4e5f6a",
    "stop": "3e4f5a6b7c8d4e9f0a1b2c3d4e5f6a7b",
    "rescan": "4f5a6b7c8d9e4f0a1b2c3d4e5f6a7b8c",
    "lock_seen": "5a6b7c8d9e0f4a1b2c3d4e5f6a7b8c9d",
    "overflow_recovered": "6b7c8d9e0f1a4b2c3d4e5f6a7b8c9d0e",
    "temp_recovered": "7c8d9e0f1a2b4c3d4e5f6a7b8c9d0e1f",
    "error": "8d9e0f1a2b3c4d4e5f6a7b8c9d0e1f2a",
    "memory_dir_added": "65074dd73b6e4cc18b67746f05643212",
    "memory_dir_removed": "e19989db96c24cb4abba9639326e11b8",
    "memory_dir_busy": "9e6e3817119a4076b6638db108148301",
    "memory_dir_error": "8b1a3b02e3754abe93bbe98158de47dc",
    "staging_changed": "a8e4907125ee4ee396ef6669bfe3bb82",
    "watch_failed": "cb27afd0a35d49a4a4901ed0657842aa",
    "observer_died": "845149373c7f4d0fa061fbb6413af8a4",
    "conflict_parked": "023eb8ebcf7c4082b4de5aaa93ec199c",
    "crash": "0613292014ac4ba1b43dd000e3254af1",
    "deadletter_recovery": "f2daf41895f2415ca6db03d959d24115",
    "deadletter_recovered": "70aca388f2464c9e95e4af7a81a66fca",
    "deadletter_recover_failed": "1d0bc16b998e47e1837ff145e4d08bb8",
    "deadletter_purged": "4e1c77b319434bf89fee629cfef8f75f",
}
_DEFAULT_MESSAGE_ID: Final = "9e0f1a2b3c4d4e5f6a7b8c9d0e1f2a3b"
#: syslog priorities: a quarantine is a warning, errors are errors, the rest information.
_PRIORITIES: Final = {
    "quarantined": 4,
    "deferred": 6,
    "repaired": 5,
    "foreign": 6,
    "valid": 6,
    "skipped": 6,
}
_LEVEL_PRIORITIES: Final = {"critical": 2, "error": 3, "warning": 4, "info": 6, "debug": 7}


def _json_default(value: object) -> object:
    return str(value)


def dumps(event: Any) -> str:
    """Serialize an event; falls back to the standard library for values msgspec refuses."""
    try:
        return msgspec.json.encode(event).decode()
    except (TypeError, UnicodeEncodeError, OverflowError):
        return json.dumps(event, default=_json_default)


def message(event: MutableMapping[str, Any]) -> str:
    """The one readable line for a person (journal ``MESSAGE``, the console)."""
    kind = event.get("event", "")
    if kind == "decision":
        text = f"{event.get('decision')} {event.get('path')}"
        reasons = event.get("reasons") or []
        if reasons:
            text += f": {reasons[0]}" + (f" (+{len(reasons) - 1} more)" if len(reasons) > 1 else "")
        return text
    extras = ", ".join(
        f"{k}={v}" for k, v in event.items() if k not in ("event", "timestamp", "level")
    )
    return f"{kind}: {extras}" if extras else str(kind)


def priority(event: MutableMapping[str, Any]) -> int:
    if event.get("event") == "decision" and event.get("level", "info") == "info":
        return _PRIORITIES.get(str(event.get("decision")), 6)
    return _LEVEL_PRIORITIES.get(str(event.get("level", "info")), 6)


def journal_fields(event: MutableMapping[str, Any]) -> dict[str, str]:
    """Every event key as a ``MEMSTAGED_<KEY>`` field; lists and dicts as JSON text."""
    fields: dict[str, str] = {}
    for key, value in event.items():
        if value is None:
            continue  # an unknown session id has no field, rather than the text "null"
        name = "MEMSTAGED_" + "".join(c if c.isascii() and c.isalnum() else "_" for c in key)
        fields[name.upper()[:64]] = value if isinstance(value, str) else dumps(value)
    fields["MESSAGE"] = message(event)
    fields["PRIORITY"] = str(priority(event))
    fields["MESSAGE_ID"] = MESSAGE_IDS.get(str(event.get("event")), _DEFAULT_MESSAGE_ID)
    fields["SYSLOG_IDENTIFIER"] = "memstaged"
    return fields


class JournalHandler(logging.Handler):
    """Sends the structlog event dict of each record to journald with its fields.

    Values are sent as UTF-8 bytes; a path that is not valid UTF-8 (a lone surrogate from
    ``os.fsdecode``) keeps its original bytes instead of failing the send. If journald cannot be
    reached the event is written to stderr as a JSON line (the decision log file has it too):
    logging never raises into the work loop and never prints a traceback per event.
    """

    def __init__(self, send: Any = None) -> None:
        super().__init__()
        if send is None:
            from systemd import journal  # imported here: only needed under systemd

            send = journal.sendv
        self._sendv = send

    def emit(self, record: logging.LogRecord) -> None:
        event = record.msg
        if not isinstance(event, dict):
            event = {"event": str(event), "level": record.levelname.lower()}
        try:
            lines = [
                name.encode() + b"=" + value.encode("utf-8", "surrogateescape")
                for name, value in journal_fields(event).items()
            ]
            self._sendv(*lines)
        except Exception:  # noqa: BLE001 - a lost journal must not stop the daemon
            try:
                sys.stderr.write(dumps(event) + "\n")
                sys.stderr.flush()
            except (OSError, ValueError):
                pass  # stderr is gone too: the decision log file still has the event


class _EventFormatter(logging.Formatter):
    """Renders the event dict a record carries (structlog's ``render_to_log_kwargs`` style)."""

    def __init__(self, pretty: bool) -> None:
        super().__init__()
        self.pretty = pretty

    def format(self, record: logging.LogRecord) -> str:
        event = record.msg if isinstance(record.msg, dict) else {"event": str(record.msg)}
        if not self.pretty:
            # The file and a non-TTY stderr both want the JSON line: render it once per event.
            line: str | None = getattr(record, "memstaged_json", None)
            if line is None:
                line = dumps(event)
                record.memstaged_json = line
            return line
        stamp = str(event.get("timestamp", ""))[11:23]
        return f"{stamp} {event.get('level', 'info')!s:7} {message(event)}"


def _pass_dict(_logger: Any, _name: str, event: MutableMapping[str, Any]) -> Any:
    # The stdlib logger receives the event dict itself as the record's message.
    return ((event,), {})


def journal_available() -> bool:
    """Under systemd (``JOURNAL_STREAM``/``INVOCATION_ID``) and journald's socket is there."""
    under_systemd = "JOURNAL_STREAM" in os.environ or "INVOCATION_ID" in os.environ
    return under_systemd and Path(JOURNAL_SOCKET).exists()


def configure(
    log_file: Path | None,
    *,
    max_bytes: int = 10 * 1024 * 1024,
    backups: int = 5,
    console: str = "auto",
    journal: str = "auto",
) -> None:
    """Set up structlog and the sinks. ``console``/``journal`` are ``auto``, ``on`` or ``off``."""
    root = logging.getLogger(LOGGER_NAME)
    for handler in list(root.handlers):
        root.removeHandler(handler)
        handler.close()
    root.setLevel(logging.DEBUG)
    root.propagate = False
    use_journal = journal == "on" or (journal == "auto" and journal_available())
    if use_journal:
        try:
            root.addHandler(JournalHandler())
        except ImportError:
            use_journal = False
    if log_file is not None:
        log_file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        file_handler = logging.handlers.RotatingFileHandler(
            log_file, maxBytes=max_bytes, backupCount=backups, encoding="utf-8"
        )
        file_handler.setFormatter(_EventFormatter(pretty=False))
        root.addHandler(file_handler)
        os.chmod(log_file, 0o600)  # the handler created it with the umask's mode
    if console == "on" or (console == "auto" and not use_journal):
        stream = logging.StreamHandler(sys.stderr)
        stream.setFormatter(_EventFormatter(pretty=sys.stderr.isatty()))
        root.addHandler(stream)
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True, key="timestamp"),
            _pass_dict,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=False,
    )


def get_logger() -> Any:
    return structlog.get_logger(LOGGER_NAME)
