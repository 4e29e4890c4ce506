"""memstaged: decides every agent-memory staging file as it arrives (see SPEC.md).

Valid files are left alone, repairable ones rewritten, the rest quarantined with their bytes.

The engine (``decide`` and its types) is imported on first use, not with the package: every
command imports ``memstaged``, and most of them (``status``, ``--once`` on nothing new) never
decide a file (start-up).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from memstaged.core.decide import Context, Decision, Verdict, decide

    __version__: str

__all__ = ["Context", "Decision", "Verdict", "__version__", "decide"]

_ENGINE = frozenset({"Context", "Decision", "Verdict", "decide"})
#: The version of a copy of the package that was not installed (no distribution metadata).
UNKNOWN_VERSION = "0+unknown"


def _version() -> str:
    """The installed distribution's version, which the build took from git (setuptools-scm:
    ``0.2.0`` on a release tag, ``0.2.1.dev3+g1234abc`` three commits after it). Read from the
    metadata when asked, not on import: importlib.metadata costs milliseconds of every start-up."""
    from importlib import metadata

    try:
        return metadata.version("memstaged")
    except metadata.PackageNotFoundError:
        return UNKNOWN_VERSION


def __getattr__(name: str) -> Any:
    if name in _ENGINE:
        from memstaged.core import decide as triage

        return getattr(triage, name)
    if name == "__version__":
        return _version()
    raise AttributeError(f"module 'memstaged' has no attribute {name!r}")
