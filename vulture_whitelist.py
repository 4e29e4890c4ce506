"""Names vulture cannot see used (`make lint` runs vulture on memstaged and this file alone).

Only what is used from outside Python's view belongs here: a protocol's methods that a library
calls, fields read by name, module hooks. Dead code does not: delete it, with its tests.
"""

# Vulture's whitelist format: bare names, and ``_.name`` for an attribute; never run or imported.

# Module ``__getattr__`` (PEP 562): memstaged's lazy engine names.
__getattr__
# msgspec / dataclass fields, filled in by keyword and read by encoding (JSON output, asdict).
deferred_since  # memstaged/cli/commands/stats.py Stuck
last_seen  # memstaged/cli/commands/stats.py Stuck
duration_ms  # memstaged/run/decision.py DecisionEvent
# argparse-manpage's Manpage reads ``manual`` when it renders the page.
_.manual
# watchdog's inotify callbacks, called by watchdog's emitter.
_.on_event
_.on_watch_deleted
_.on_queue_overflow
_.on_events_lost  # watchdog >= 7.1.1
_.dispatch
