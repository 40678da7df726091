"""Where a cold start's seconds went, read from the revision's logs: pure, so every rule is tested without a server.

A sample runs from the request that found no instance to its first streamed token. Between the two, Cloud Run and
vLLM each log what they did (docs/cold-start.md lists the lines and their sources):

- Cloud Run, in ``run.googleapis.com/varlog/system``: "Starting new instance. Reason: ..." when it starts an
  instance, and "... STARTUP ... probe succeeded ..." when the startup probe passes;
- the container: its first line (the process has started), then vLLM's own lines: "Loading weights took X seconds"
  (or "Model loading took ... and X seconds"), "torch.compile takes X s in total", "Graph capturing finished in X
  secs", "init engine (profile, create kv cache, warmup model) took X seconds", and uvicorn's "Application startup
  complete.".

The phases (seconds each, named in ``PHASES``) are the gaps between those marks, and inside vLLM's start the
durations vLLM reports itself: its own figures need no clock shared with Cloud Run's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

# Each phase and what it stands for (the README's table).
PHASES = {
    "instance_start": "the request sent until Cloud Run starts an instance (a GPU found and allocated)",
    "container_start": "the instance started until the container's first log line (image pulled, container started)",
    "engine_setup": "the first line until weights start loading (imports, config, platform and device init)",
    "weights_load": "vLLM loading the weights (its own figure)",
    "compile": "torch.compile of the model (vLLM's figure; none when eager or served from the compile cache's hits)",
    "graph_capture": "CUDA graph capture (vLLM's figure; none when eager)",
    "kv_cache_init": "the rest of vLLM's engine init: memory profiling, KV cache allocation, warm-up",
    "api_server_start": "the engine ready until the API server accepts connections",
    "startup_probe": "the API server up until Cloud Run's startup probe passes and routes the request",
    "first_token": "the probe passed until the first streamed token (prefill and the first decode step)",
}

# The marks, each tolerant of the wordings vLLM has used (0.32's first; older and newer in public logs: r38 facts in
# FACTS.md, "Cold-start lines"). Message text only, never the `[file.py:NNN]` tag or the process prefix, which move.
_INSTANCE_STARTED = re.compile(r"^Starting new instance\b")
_PROBE_PASSED = re.compile(r"\bSTARTUP\b.*\bprobe succeeded\b")
_LOAD_STARTED = re.compile(r"Starting to load model ")
# default_loader.py:501 "Loading weights took %.2f seconds"; gpu_model_runner.py:5149 "Model loading took %s GiB memory
# and %.6f seconds" (older: "%.4f GiB and"). runai_streamer logs neither on CPU: the gap to the next mark stands in.
_WEIGHTS = re.compile(
    r"Loading weights took ([\d.]+) seconds|Model loading took ([\d.]+) GiB(?: memory)? and ([\d.]+) s"
)
# runai_streamer's own figure, on stderr only with RUNAI_STREAMER_LOG_TO_STDERR=1 (which render.streamer_env sets):
# "... [INFO] [RunAI Streamer] Overall time to stream 2.8 MiB of all files to cpu: 0.03s, 93.3 MiB/s"
# (runai_model_streamer 0.17.1, safetensors_streamer.py:237).
_STREAMED = re.compile(r"Overall time to stream .+? of all files(?: to \S+)?: ([\d.]+)s")
# monitor.py:62 "torch.compile took %.2f s in total" (older: "takes"). On CPU vLLM hands compile to Inductor and says
# only "Warming up model for the compilation..." and "Warming up done." (cpu_model_runner.py:87, :91).
_COMPILE = re.compile(r"torch\.compile (?:took|takes) ([\d.]+) s in total")
_CPU_COMPILE_STARTED = re.compile(r"Warming up model for the compilation")
_CPU_COMPILE_DONE = re.compile(r"Warming up done\.")
_GRAPHS = re.compile(r"Graph capturing finished in ([\d.]+) secs?")
# core.py:385-402 "... took %.2f s" with or without "(compilation: %.2f s)" (older: "took %.2f seconds").
_ENGINE_INIT = re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s")
_API_READY = re.compile(r"Application startup complete\.")


@dataclass(frozen=True)
class LogLine:
    """One log entry of the instance: when Cloud Logging stamped it, its text, and whether Cloud Run wrote it."""

    at: datetime
    text: str
    system: bool = False


@dataclass
class Marks:
    """What the lines of one cold start said: the times of its marks and vLLM's own durations."""

    instance_started: datetime | None = None
    first_line: datetime | None = None
    load_started: datetime | None = None
    weights_loaded: datetime | None = None
    weights_s: float | None = None
    weights_gib: float | None = None  # the runner's figure (GPU): what the weights take in memory
    compile_started: datetime | None = None
    compile_done: datetime | None = None
    compile_s: float | None = None
    graphs_s: float = 0.0
    engine_ready: datetime | None = None
    engine_init_s: float | None = None
    api_ready: datetime | None = None
    probe_passed: datetime | None = None


def _container_mark(found: Marks, line: LogLine) -> None:
    """The mark a container line sets, the first time it appears."""
    text = line.text
    if found.load_started is None and _LOAD_STARTED.search(text):
        found.load_started = line.at
    elif (found.weights_s is None or found.weights_gib is None) and (match := _WEIGHTS.search(text)):
        # Both lines may come (the loader's, then the runner's with the size): the first time, the runner's size.
        if found.weights_s is None:
            found.weights_loaded, found.weights_s = line.at, float(match.group(1) or match.group(3))
        if match.group(2):
            found.weights_gib = float(match.group(2))
    elif found.weights_s is None and (match := _STREAMED.search(text)):
        found.weights_loaded, found.weights_s = line.at, float(match.group(1))
    elif found.compile_s is None and (match := _COMPILE.search(text)):
        found.compile_s = float(match.group(1))
    elif found.compile_started is None and _CPU_COMPILE_STARTED.search(text):
        found.compile_started = line.at
    elif found.compile_done is None and _CPU_COMPILE_DONE.search(text):
        found.compile_done = line.at
    elif match := _GRAPHS.search(text):
        found.graphs_s = float(match.group(1))
    elif found.engine_init_s is None and (match := _ENGINE_INIT.search(text)):
        found.engine_ready, found.engine_init_s = line.at, float(match.group(1))
    elif found.api_ready is None and _API_READY.search(text):
        found.api_ready = line.at


def marks(lines: list[LogLine]) -> Marks:
    """The marks of one instance's start, from its lines oldest first (later repeats are ignored)."""
    found = Marks()
    for line in lines:
        if not line.system:
            found.first_line = found.first_line or line.at
            _container_mark(found, line)
        elif found.instance_started is None and _INSTANCE_STARTED.search(line.text):
            found.instance_started = line.at
        elif found.probe_passed is None and _PROBE_PASSED.search(line.text):
            found.probe_passed = line.at
    return found


def _gap(start: datetime | None, end: datetime | None) -> float | None:
    """Seconds from ``start`` to ``end``; never negative (two clocks, Cloud Logging's and the caller's, may disagree
    by a little)."""
    if start is None or end is None:
        return None
    return max((end - start).total_seconds(), 0.0)


def _weights(found: Marks) -> float | None:
    """vLLM's own figure; without one (runai_streamer on CPU), from the load's start to the next mark."""
    if found.weights_s is not None:
        return found.weights_s
    return _gap(found.load_started, found.compile_started or found.engine_ready)


def _compile(found: Marks) -> float | None:
    """vLLM's own figure (GPU); on CPU, the warm-up that compiles, from its two lines."""
    return found.compile_s if found.compile_s is not None else _gap(found.compile_started, found.compile_done)


def phases(sent: datetime, first_token: datetime, found: Marks) -> dict[str, float]:
    """Each phase the marks allow, in the order of ``PHASES``; a phase whose marks are missing is left out."""
    load_started = found.load_started
    if load_started is None and found.weights_loaded is not None and found.weights_s is not None:
        load_started = datetime.fromtimestamp(
            found.weights_loaded.timestamp() - found.weights_s, found.weights_loaded.tzinfo
        )
    compile_s = _compile(found)
    kv_cache = None
    if found.engine_init_s is not None:
        kv_cache = max(found.engine_init_s - (compile_s or 0.0) - found.graphs_s, 0.0)
    gaps: dict[str, float | None] = {
        "instance_start": _gap(sent, found.instance_started),
        "container_start": _gap(found.instance_started, found.first_line),
        "engine_setup": _gap(found.first_line, load_started),
        "weights_load": _weights(found),
        "compile": compile_s or None,
        "graph_capture": found.graphs_s or None,
        "kv_cache_init": kv_cache,
        "api_server_start": _gap(found.engine_ready, found.api_ready),
        "startup_probe": _gap(found.api_ready, found.probe_passed),
        "first_token": _gap(found.probe_passed or found.api_ready, first_token),
    }
    return {name: round(seconds, 3) for name, seconds in gaps.items() if seconds is not None}
