"""The measures of ``bench/run.py``, one module per group; each ``measure_*`` returns rows."""
