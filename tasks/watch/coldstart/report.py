"""What a cold-start run found: its samples, a table and a chart of their phases, and what to try first.

Pure: the flow publishes ``markdown(report)`` as the artifact ``cold-start-<service>``.
"""

from __future__ import annotations

import statistics

from pydantic import BaseModel, Field

from tasks.watch.coldstart.phases import PHASES

CHART_WIDTH = 60
# One letter a phase in the chart, in PHASES' order.
LETTERS = dict(zip(PHASES, "ICSWTGKAPF", strict=True))


class Sample(BaseModel):
    """One cold start: the request to its first streamed token, and the phases its logs explain."""

    number: int
    ttft_s: float = Field(description="Seconds from the request to the first streamed token.")
    phases: dict[str, float] = Field(default_factory=dict, description="Phase name to seconds (README's table).")
    cold: bool = Field(True, description="False: the request found an instance running (not counted).")
    instance: str | None = None
    refused_for_s: float = Field(0.0, description="Seconds the request was refused before (a GPU not yet released).")
    weights_gib: float | None = None
    decode_tokens_per_s: float | None = Field(
        None, description="The same request's tokens after the first, a second: what compiling buys (issue 38)."
    )

    @property
    def explained_s(self) -> float:
        return sum(self.phases.values())


class ColdStartReport(BaseModel):
    """A cold-start run's answer: the samples and what they say."""

    service: str
    revision: str = Field(description="The serving revision whose configuration was measured.")
    copy_service: str
    copy_revision: str = Field("", description="The copy's revision: its logs stay in Cloud Logging after it is gone.")
    samples: list[Sample]
    compile_cache: str | None = Field(None, description="The compile cache's folder in the bucket, when it has one.")
    recommendation: str = ""

    @property
    def cold(self) -> list[Sample]:
        return [sample for sample in self.samples if sample.cold]


def medians(samples: list[Sample]) -> dict[str, float]:
    """Each phase's median over the samples that have it, in PHASES' order."""
    found = {name: [s.phases[name] for s in samples if name in s.phases] for name in PHASES}
    return {name: round(statistics.median(values), 3) for name, values in found.items() if values}


def recommend(samples: list[Sample], compile_cache: str | None = None) -> str:
    """What to try first, from the phase that takes the most time (medians over the cold samples)."""
    typical = medians(samples)
    if not typical:
        return "no phase could be read from the logs: check that the revision's logs reach Cloud Logging"
    phase, seconds = max(typical.items(), key=lambda item: item[1])
    share = seconds / max(sum(typical.values()), 1e-9)
    said = f"{phase} takes {seconds:.1f} s, {share:.0%} of the start's phases (medians)"
    sizes = [s.weights_gib for s in samples if s.weights_gib]
    advice = {
        "instance_start": "Cloud Run waited for an instance (and its GPU): keep one warm in working hours with the "
        "scale-service schedules (min_instances 1), or check the region's GPU quota",
        "container_start": "the image took long to pull and start: keep the image in Artifact Registry in the "
        "service's region, and small (no build tools in the final stage)",
        "engine_setup": "imports and device set-up: little a setting changes; an image with fewer packages helps",
        "weights_load": "the weights dominate"
        + (f" ({sizes[0]:.1f} GiB at {sizes[0] * 1024 / seconds:.0f} MB/s)" if sizes and seconds else "")
        + ": try the profile's load_mode runai-streamer (parallel ranged reads from the bucket), or Direct VPC "
        "egress for the Cloud Storage volume",
        "compile": (
            f"torch.compile dominates although the compile cache is on ({compile_cache}): a start after a change of "
            "image, commit or vLLM options compiles and saves once; when every start compiles, look in the copy's "
            "logs for failed writes under /mnt/compile-cache (the serving account's grant on compile-cache/)"
            if compile_cache
            else "torch.compile dominates: turn on the profile's compile_cache (vLLM's and Inductor's caches kept in "
            "the bucket: the first start compiles and saves, the next ones restore), or set vllm.enforce_eager "
            "(starts faster, decodes slower)"
        ),
        "graph_capture": "CUDA graph capture dominates: capture fewer sizes (vllm.extra_args --cuda-graph-sizes), or "
        "set vllm.enforce_eager",
        "kv_cache_init": "memory profiling and the KV cache: size it yourself (--kv-cache-memory-bytes) or lower "
        "max_model_len",
        "api_server_start": "the API server's own start: nothing to tune here; report it if it stays long",
        "startup_probe": "the startup probe passed long after the server was up: shorten its period",
        "first_token": "the first request itself was slow: a long prompt, or a first-request warm-up in the engine",
    }[phase]
    return f"{said}: {advice}."


def chart(samples: list[Sample]) -> list[str]:
    """One bar a sample, a letter a phase, scaled to the longest time to first token."""
    longest = max((s.ttft_s for s in samples), default=0.0) or 1.0
    legend = ", ".join(f"{letter} {name}" for name, letter in LETTERS.items())
    lines = ["```", f"scale: {CHART_WIDTH} characters = {longest:.1f} s; {legend}; . not explained"]
    for sample in samples:
        bar = "".join(LETTERS[name] * round(seconds / longest * CHART_WIDTH) for name, seconds in sample.phases.items())
        rest = max(round(sample.ttft_s / longest * CHART_WIDTH) - len(bar), 0)
        lines.append(f"#{sample.number} {bar}{'.' * rest} {sample.ttft_s:.1f} s")
    return [*lines, "```"]


def markdown(report: ColdStartReport) -> str:
    """The artifact: what was measured, a table of phases per sample, the chart, and the recommendation."""
    cold = report.cold
    lines = [f"# Cold start of {report.service}", "",
             f"{len(cold)} cold start(s) of revision `{report.revision}`'s configuration, measured on the copy "
             f"`{report.copy_service}` (deleted after; its logs are revision `{report.copy_revision}`'s); "
             "production traffic untouched.", ""]  # fmt: skip
    names = [name for name in PHASES if any(name in s.phases for s in cold)]
    if report.compile_cache:
        lines += [f"Compile cache: `{report.compile_cache}` (restored at each start, saved by the first).", ""]
    lines += ["| sample | time to first token | " + " | ".join(names) + " | explained | decode tok/s |",
              "|---" * (len(names) + 4) + "|"]  # fmt: skip
    for sample in report.samples:
        cells = [f"{sample.phases[n]:.1f}" if n in sample.phases else "-" for n in names]
        explained = f"{sample.explained_s / sample.ttft_s:.0%}" if sample.cold and sample.ttft_s else "not cold"
        decode = f"{sample.decode_tokens_per_s:.1f}" if sample.decode_tokens_per_s else "-"
        lines.append(
            f"| #{sample.number} | {sample.ttft_s:.1f} s | " + " | ".join(cells) + f" | {explained} | {decode} |"
        )
    lines += ["", *chart(cold), "", f"**Recommendation:** {report.recommendation}", "", "Phases:", ""]
    lines += [f"- `{name}`: {PHASES[name]}" for name in names]
    return "\n".join(lines) + "\n"
