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

__all__ = ["Context", "Decision", "Verdict", "__version__", "decide"]
__version__ = "0.1.0"

_ENGINE = frozenset({"Context", "Decision", "Verdict", "decide"})


def __getattr__(name: str) -> Any:
    if name in _ENGINE:
        from memstaged.core import decide as triage

        return getattr(triage, name)
    raise AttributeError(f"module 'memstaged' has no attribute {name!r}")
