"""The few exceptions memstaged raises, in one place.

Each carries a message that is shown to the user as one line, so it must name the file, the option
or the key at fault. Exceptions from libraries are re-raised at module boundaries as one of these
(``raise ConfigError(...) from None``) so that no traceback reaches a user.
"""

from __future__ import annotations

import errno as _errno


class MemstagedError(Exception):
    """Base of every error memstaged reports to a user; ``str(err)`` is the one-line message."""


class ConfigError(MemstagedError):
    """A bad setting: unknown key, wrong type, a memory dir that cannot be used. Exit code 2."""


class UsageError(MemstagedError):
    """A bad command line that argparse could not catch by itself. Exit code 2."""


class BusyError(MemstagedError):
    """Another memstaged already works on a memory dir (SPEC section 5). Exit code 1."""


class NotPrivate(PermissionError):
    """A directory memstaged keeps its own state or its control socket in is not the user's own
    and private (a link, another owner, open to group or others): what is in it may be another
    user's, and is not trusted (as ssh refuses such a directory).

    An :class:`OSError` (``EPERM``), so that what opens a file there treats it as one it cannot
    use; a command refuses it with one line (exit 2) through
    :func:`memstaged.config.own_state_dir`. ``strerror`` is that line.
    """


class Terminated(BaseException):
    """SIGTERM to ``--once``: the run stops as on Ctrl-C, exit 143.

    A BaseException, like KeyboardInterrupt, so that no ``except Exception`` turns it into a
    decision: a transaction it lands in leaves its temps as a kill would (the next run deletes
    them) and releases ``canonical-writer.lock`` on its way out, which a kill by the signal's
    default action would leave for the next memstaged to find stale, the reconciler waiting.
    """


class NotJSON(MemstagedError):
    """The bytes are not RFC 8259 JSON in UTF-8, as the reconciler's ``JSON.parse`` would see it."""


class LogUnwritable(MemstagedError):
    """The decision log file cannot be written or made durable (SPEC 5 and 7). Exit code 1.

    Raised where a decision is announced, before anything of it is carried out: the change
    waits (the file is ``deferred``, recover and purge stop) until the log can be written again.
    """

    def __init__(self, path: object, err: OSError) -> None:
        if err.strerror:
            name = _errno.errorcode.get(err.errno or 0, str(err.errno))
            self.why = f"{err.strerror} ({name})"
        else:
            self.why = str(err) or type(err).__name__
        self.path = path
        self.errno = err.errno
        super().__init__(
            f"the decision log {path} cannot be written: {self.why}; nothing more was changed "
            "(nothing is carried out unlogged: try again once the log can be written)"
        )

    @property
    def reason(self) -> str:
        """The ``reasons`` entry of the decision that waits for the log."""
        return f"the decision log cannot be written: {self.why}"
