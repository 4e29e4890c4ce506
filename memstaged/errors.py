"""The few exceptions memstaged raises, in one place.

Each carries a message that is shown to the user as one line, so it must name the file, the option
or the key at fault. Exceptions from libraries are re-raised at module boundaries as one of these
(``raise ConfigError(...) from None``) so that no traceback reaches a user.
"""

from __future__ import annotations


class MemstagedError(Exception):
    """Base of every error memstaged reports to a user; ``str(err)`` is the one-line message."""


class ConfigError(MemstagedError):
    """A bad setting: unknown key, wrong type, a memory dir that cannot be used. Exit code 2."""


class UsageError(MemstagedError):
    """A bad command line that argparse could not catch by itself. Exit code 2."""


class BusyError(MemstagedError):
    """Another memstaged already works on a memory dir (SPEC section 5). Exit code 1."""


class NotJSON(MemstagedError):
    """The bytes are not RFC 8259 JSON in UTF-8, as the reconciler's ``JSON.parse`` would see it."""
