"""vLLM's /metrics (Prometheus text), summed by metric name."""

from __future__ import annotations

from collections.abc import Collection

from prometheus_client.parser import text_string_to_metric_families


def sum_samples(text: str, wanted: Collection[str]) -> dict[str, float]:
    """{sample name (less `_total`): sum over all label sets} for the ``wanted`` names."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name.removesuffix("_total")
            if name in wanted:
                values[name] = values.get(name, 0.0) + float(sample.value)
    return values
