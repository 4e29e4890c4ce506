"""The metrics file read back as a collector reads it: with ``prometheus_client``'s own parser
(what node_exporter's textfile collector accepts), never with a parser of the tests' own."""

from __future__ import annotations

from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families


def samples(path: Path) -> dict[str, float]:
    """Every sample of the metrics file, keyed ``name{label=value,...}`` (labels sorted)."""
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(path.read_text(encoding="utf-8")):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            found[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return found


def sample(path: Path, name: str) -> float | None:
    """One sample's value; ``None`` while the file is not there yet, or has no such sample."""
    try:
        return samples(path).get(name)
    except FileNotFoundError:
        return None
