"""memstaged: decides every agent-memory staging file as it arrives (see SPEC.md).

Valid files are left alone, repairable ones rewritten, the rest quarantined with their bytes.
"""

from memstaged.triage import Context, Decision, Verdict, decide

__all__ = ["Context", "Decision", "Verdict", "__version__", "decide"]
__version__ = "0.1.0"
