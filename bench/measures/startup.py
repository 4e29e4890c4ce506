"""8. Start-up: ``--once``, ``check`` and ``status``, with what their imports cost (issue 14)."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from dataclasses import asdict
from typing import Final

import corpus  # sibling scripts: bench/ is on sys.path when this script runs
import costs
from harness import (
    DETAILS,
    PYTHON,
    Corpora,
    Plan,
    Row,
    _timed,
    children_cpu,
    err,
    fmt,
    median,
    sandbox,
    wait_quiet,
)

# ---------------------------------------------------------------------------- measures
#: The start-up measures of issue 14: (key, label, memstaged arguments, target in ms).
STARTUP_COMMANDS: Final = (
    ("once", "--once, empty memory dir", 100.0),
    ("check", "check of one valid file", 80.0),
    ("status", "status, one empty memory dir", 100.0),
)


def _startup_args(c: Corpora, key: str) -> list[str]:
    """The memstaged arguments of one start-up measure (after ``python -m memstaged``)."""
    if key == "once":
        return ["--once", "--memory-dir", str(c.empty)]
    if key == "check":
        first = c.valid / corpus.PRISTINE_NAME / c.valid_manifest.files[0].name
        return ["check", "--project-root", c.valid_manifest.project_root, str(first)]
    return ["status", "--memory-dir", str(c.empty)]


def _imports_note(entries: Sequence[costs.Imported]) -> str:
    top = costs.top_imports(entries, 6, min_depth=1)
    listed = ", ".join(f"{e.module} {e.cumulative_ms:.0f}" for e in top)
    total = costs.total_import_ms(entries)
    return f"imports {total:.0f} ms in all; costliest (cumulative ms): {listed}"


def measure_startup(c: Corpora, plan: Plan) -> tuple[list[Row], float]:
    """8. Start-up of ``--once`` (empty memory dir), ``check`` (one file) and ``status``.

    Each is taken in turn with ``python -c pass`` and ``node -e 0`` in every repeat, so the
    interpreters' own start-up on this machine, at this moment, is the baseline. Then one
    ``python -X importtime`` run of each command says what its imports cost.
    """
    err.print("[bold]8 start-up[/]")
    node = shutil.which("node")
    times: dict[str, list[float]] = {k: [] for k, _, _ in STARTUP_COMMANDS}
    bare: list[float] = []
    js: list[float] = []
    cpu: dict[str, list[float]] = {k: [] for k in times}
    wait_quiet("start-up")
    with sandbox(c.work) as box:
        env = env_of_startup = box.env()
        for _ in range(plan.startup_repeat):
            bare.append(_timed([PYTHON, "-c", "pass"], env))
            if node is not None:
                js.append(_timed([node, "-e", "0"], env))
            for key, samples in times.items():
                cpu0 = children_cpu()
                cmd = [PYTHON, "-m", "memstaged", *_startup_args(c, key)]
                samples.append(_timed(cmd, env, ok=(0, 1)))  # status: 1 = needs care
                cpu[key].append(children_cpu() - cpu0)
        imports = {
            key: costs.importtime_min(["-m", "memstaged", *_startup_args(c, key)], env, runs=5)
            for key in times
        }
    import_cpu = _import_cpu(env_of_startup)
    DETAILS["import_cpu_ms"] = import_cpu
    DETAILS["imports"] = {
        key: [asdict(e) for e in costs.top_imports(entries, 25)] for key, entries in imports.items()
    }
    b = median(bare)
    js_note = f"; node -e 0: {median(js) * 1000:.1f} ms" if js else "; node not found"
    rows = []
    for key, label, target in STARTUP_COMMANDS:
        t = median(times[key])
        err.print(
            f"  {label}: {t * 1000:.0f} ms (python -c pass {b * 1000:.0f} ms"
            f"{js_note.replace('; ', ', ')})"
        )
        rows.append(
            Row(
                f"8 start-up: {label}",
                t * 1000,
                "ms",
                f"python -c pass: {fmt(b * 1000)} ms",
                t / b,
                "x bare interpreter",
                f"≤ {target:g} ms",
                t * 1000 <= target,
                [x * 1000 for x in times[key]],
                f"CPU {median(cpu[key]) * 1000:.0f} ms{js_note}; " + _imports_note(imports[key]),
                [x * 1000 for x in bare],
            )
        )
    for module, ms in import_cpu.items():
        rows.append(
            Row(
                f"8 import CPU: {module}",
                ms,
                "CPU ms",
                "python -c pass",
                note="least of 5 fresh interpreters, minus python -c pass's least",
            )
        )
    return rows, median(times["once"])


def _import_cpu(env: dict[str, str], runs: int = 5) -> dict[str, float]:
    """CPU ms of importing each of :data:`IMPORT_CPU_MODULES` in a fresh interpreter.

    The least of ``runs`` interpreters, minus the least CPU of ``python -c pass``: on a machine
    busy with other work, CPU time says more about the import than ``-X importtime``'s wall time.
    """

    def least(code: str) -> float:
        spent = []
        for _ in range(runs):
            cpu0 = children_cpu()
            _timed([PYTHON, "-c", code], env)
            spent.append(children_cpu() - cpu0)
        return min(spent)

    bare = least("pass")
    return {m: round((least(f"import {m}") - bare) * 1000, 1) for m in IMPORT_CPU_MODULES}


#: Modules whose import cost (CPU, which a busy machine inflates less than wall time) is
#: reported: what memstaged's commands import, and what those pull in.
IMPORT_CPU_MODULES: Final = (
    "msgspec",
    "structlog",
    "asyncio",
    "rich.console",
    "rich.traceback",
    "watchdog.observers.inotify",
    "systemd.journal",
    "memstaged.core.decide",
    "memstaged.log.writer",
    "memstaged.config",
    "memstaged.cli.commands._common",
    "memstaged.run.once",
    "memstaged.daemon.loop",
)
