"""Names vulture cannot see used (`make lint` runs vulture on memstaged, tests, bench and this file).

Only what is used from outside Python's view belongs here: a protocol's methods that a library
calls, fields read by name, module hooks, pytest fixtures and marks. Dead code does not: delete it.
"""

# Vulture's whitelist format: bare names, and ``_.name`` for an attribute; never run or imported.

# Module ``__getattr__`` (PEP 562): memstaged's lazy engine names.
__getattr__
# msgspec / dataclass fields, filled in by keyword and read by encoding (JSON output, asdict).
deferred_since  # memstaged/cli/commands/stats.py Stuck
last_seen  # memstaged/cli/commands/stats.py Stuck
baseline_samples  # bench/harness.py Row
# argparse-manpage's Manpage reads ``manual`` when it renders the page.
_.manual
# watchdog's inotify callbacks, called by watchdog's emitter.
_.on_event
_.on_watch_deleted
_.on_queue_overflow
# logging.LogRecord.msg, read by the handler under test.
_.msg
# pytest: fixtures are used by parameter name, ``pytestmark`` by the collector.
pytestmark
_real_home_untouched
_private_home
_reset_logging
plain_output
one_event
no_thread_leak
# tests/test_transaction.py: the crash test's child process calls it by name (python -c).
_drive
