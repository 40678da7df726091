"""How a model is served: Cloud Run hardware and scaling, how weights load, and the vLLM engine options."""

from __future__ import annotations

import re
from typing import ClassVar, Literal

from prefect.blocks.core import Block
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from blocks.hardware import GIB_SECOND_USD, GPUS, MODEL_GARDEN_VLLM_IMAGE, VCPU_SECOND_USD, GpuTypeName
from blocks.images import ImageBuild

# Flags the renderer sets from fields; repeating them in extra_args would contradict the profile.
MANAGED_FLAGS = {
    "--port": "container_port",
    "--host": "(always 0.0.0.0)",
    "--model": "(the model is positional, from the staged weights)",
    "--served-model-name": "(the repo id)",
    "--load-format": "load_mode",
    "--max-model-len": "vllm.max_model_len",
    "--max-num-seqs": "vllm.max_num_seqs",
    "--gpu-memory-utilization": "vllm.gpu_memory_utilization",
    "--dtype": "vllm.dtype",
    "--quantization": "vllm.quantization",
    "--kv-cache-dtype": "vllm.kv_cache_dtype",
    "--enforce-eager": "vllm.enforce_eager",
    "--enable-prefix-caching": "vllm.enable_prefix_caching",
    "--enable-chunked-prefill": "vllm.enable_chunked_prefill",
    "--tool-call-parser": "vllm.tool_call_parser",
    "--reasoning-parser": "vllm.reasoning_parser",
    "--enable-auto-tool-choice": "vllm.enable_auto_tool_choice",
}
COMPILE_CACHE_MOUNT = "/mnt/compile-cache"  # tasks/deploy/compile_cache.MOUNT_PATH
MAX_CONCURRENCY = 1000  # Cloud Run's most requests per instance
DISALLOWED_MOUNT_ROOTS = ("/dev", "/proc", "/sys")
CPU_MODE_ENV = {
    # Lesson 9 (seed 000): /dev/shm is tiny on Cloud Run and cannot be mounted over, so the CPU engine
    # must run in-process and talk to itself over loopback.
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_HOST_IP": "127.0.0.1",
    "GLOO_SOCKET_IFNAME": "lo",
    "VLLM_CPU_KVCACHE_SPACE": "4",
}


class VllmOptions(BaseModel):
    """Options of `vllm serve` the pipeline renders into the container args."""

    model_config = ConfigDict(extra="forbid")

    max_model_len: int | None = Field(8192, ge=16, description="Context length; with max_num_seqs it sizes KV memory.")
    max_num_seqs: int = Field(64, ge=1, le=4096, description="Sequences batched at once.")
    gpu_memory_utilization: float = Field(
        0.9, gt=0, le=1, description="Share of GPU memory vLLM may use (vLLM's default is 0.92)."
    )
    dtype: Literal["auto", "bfloat16", "float16", "half", "float32", "float"] = Field(
        "bfloat16", description="Weight and activation dtype."
    )
    quantization: str | None = Field(None, description="Quantization method, e.g. 'awq', 'gptq', 'fp8'.")
    kv_cache_dtype: Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2"] = Field("auto", description="KV cache dtype.")
    enforce_eager: bool = Field(
        True,
        description="Skip torch.compile and CUDA graph capture: first boot takes over 5 minutes without it and "
        "a normal startup probe rolls the deploy back (lesson 3).",
    )
    enable_prefix_caching: bool = Field(True, description="Reuse KV cache across requests sharing a prefix.")
    enable_chunked_prefill: bool = Field(True, description="Split long prefills into chunks.")
    enable_auto_tool_choice: bool = Field(False, description="Let the model call tools; needs tool_call_parser.")
    tool_call_parser: str | None = Field(None, description="Tool call parser, e.g. 'hermes', 'gemma4'.")
    reasoning_parser: str | None = Field(None, description="Reasoning parser, e.g. 'deepseek_r1', 'gemma4'.")
    generation_config: str | None = Field("auto", description="Where sampling defaults come from ('auto', 'vllm').")
    safetensors_load_strategy: Literal["lazy", "eager", "prefetch"] | None = Field(
        None,
        description="How vLLM reads safetensors (--safetensors-load-strategy, vLLM PR 24469). Empty: eager on a "
        "Cloud Storage volume, whose memory-mapped small random reads are many times slower over gcsfuse "
        "(safetensors issue 562), vLLM's own default otherwise.",
    )
    extra_args: list[str] = Field(
        default_factory=list, description="Further `vllm serve` flags, e.g. ['--limit-mm-per-prompt', '{\"image\":4}']."
    )

    @field_validator("quantization", "tool_call_parser", "reasoning_parser")
    @classmethod
    def _token(cls, value: str | None, info) -> str | None:
        if value is not None and not re.match(r"^[A-Za-z0-9_.-]+$", value):
            raise ValueError(f"vllm.{info.field_name} '{value}' must be a single name such as 'awq' or 'hermes'")
        return value

    @field_validator("extra_args")
    @classmethod
    def _extra_args(cls, value: list[str]) -> list[str]:
        for arg in value:
            if arg.startswith("--") and " " in arg.split("=", 1)[0]:
                raise ValueError(
                    f"vllm.extra_args: '{arg}' holds a flag and its value in one item; vLLM would reject it as one "
                    f"unknown argument. Split it: {arg.split()!r}"
                )
            flag = arg.split("=", 1)[0]
            if flag in MANAGED_FLAGS:
                raise ValueError(
                    f"vllm.extra_args: '{flag}' is rendered from {MANAGED_FLAGS[flag]}; set it there and remove it "
                    "from extra_args"
                )
            if flag.startswith("--no-") and f"--{flag[5:]}" in MANAGED_FLAGS:
                raise ValueError(f"vllm.extra_args: '{flag}' is controlled by {MANAGED_FLAGS['--' + flag[5:]]}")
        return value

    @model_validator(mode="after")
    def _tool_choice(self) -> VllmOptions:
        if self.enable_auto_tool_choice and not self.tool_call_parser:
            raise ValueError(
                "vllm.enable_auto_tool_choice needs vllm.tool_call_parser (vLLM refuses to start without it); "
                "set tool_call_parser, e.g. 'hermes'"
            )
        return self


class ServingProfile(Block):
    """Hardware, scaling and vLLM settings for a served model. Start from a preset: l4, rtx-pro-6000 or cpu.

    Concurrency defaults to twice max_num_seqs (lesson 20); min_instances 0 scales to zero when idle and the
    schedules raise it in business hours (lesson 16).
    """

    _block_type_name: ClassVar[str] = "Serving Profile"
    _block_type_slug: ClassVar[str] = "serving-profile"
    _description: ClassVar[str] = "Cloud Run hardware, scaling and vLLM options for serving a model."

    name: str = Field("custom", description="Preset this profile started from, or a name of your own.")
    cpu: int = Field(8, ge=1, le=32, description="vCPUs per instance.")
    memory_gib: int = Field(32, ge=1, le=128, description="Memory per instance, GiB.")
    gpu_type: GpuTypeName | None = Field("nvidia-l4", description="GPU per instance; empty for a CPU-only service.")
    gpu_zonal_redundancy: bool = Field(
        False,
        description="Reserve GPU capacity in other zones. Costs more and needs its own quota; off by default "
        "(gcloud --no-gpu-zonal-redundancy).",
    )
    min_instances: int = Field(0, ge=0, le=100, description="Instances kept warm; 0 scales to zero when idle.")
    max_instances: int = Field(1, ge=1, le=1000, description="Upper bound; GPU quota is 3 per region by default.")
    gpu_quota: int | None = Field(
        None,
        ge=0,
        description="The project's GPU quota in the region, for when Service Usage cannot be read (no "
        "serviceusage.quotas.get). The quota read from Google always decides when it can be read, so a raised quota "
        "needs no repeating here; empty with nothing readable, a new project's default is assumed (3 L4, 1 RTX Pro "
        "6000; lesson 6).",
    )
    concurrency: int | None = Field(
        None, ge=1, le=MAX_CONCURRENCY, description="Requests per instance; defaults to 2 x vllm.max_num_seqs."
    )
    watch_samples: int = Field(
        10,
        ge=0,
        le=1440,
        description="After traffic moves (and at each canary step), watch the new revision's Cloud Monitoring "
        "metrics for this many sampling periods (Cloud Run samples every 60 s: 10 is 10 minutes) and move traffic "
        "back on a breach; 0 = no watch.",
    )
    watch_without_traffic: Literal["skip", "load"] = Field(
        "skip",
        description="When the serving revision had fewer requests than the watch's min_requests over the last watch "
        "window (a quiet service, a weekend), the watch would end 'too little traffic, not judged' after waiting its "
        "whole window. 'skip': say so and promote without it. 'load': send the verify step's own chat completion "
        "min_requests times to the candidate at each step, and judge those.",
    )
    metrics: Literal["none", "vllm"] = Field(
        "none",
        description="'vllm': run Google's Managed Service for Prometheus sidecar beside vLLM, so the watch judges "
        "time to first token, time per output token and errors inside streams from vLLM's own metrics (the "
        "sidecar takes 1 vCPU and 512 MiB of the instance; the serving account needs roles/monitoring.metricWriter). "
        "'none': the watch judges Cloud Run's request metrics only.",
    )
    request_timeout_seconds: int = Field(600, ge=1, le=3600, description="Cloud Run request timeout.")
    execution_environment: Literal["gen1", "gen2"] = Field("gen2", description="Cloud Run execution environment.")
    cpu_always_allocated: bool = Field(True, description="CPU outside requests; GPU services require it.")
    startup_cpu_boost: bool = Field(True, description="Extra CPU during start-up.")
    container_port: int = Field(8080, ge=1, le=65535, description="Port vLLM listens on and Cloud Run routes to.")
    env: dict[str, str] = Field(default_factory=dict, description="Extra container environment (no secrets).")
    hf_token_at_runtime: bool = Field(
        False,
        description="Give the container HF_TOKEN from Secret Manager, for a runtime that reaches the Hub (LoRA "
        "adapters, a gated tokenizer). The pipeline stores the model source's token as the target's "
        "hf_token_secret and grants only the service account access to it; weights are still staged.",
    )
    load_mode: Literal["gcs-volume", "runai-streamer"] = Field(
        "gcs-volume",
        description="How weights reach vLLM: a Cloud Storage volume mount, or streamed from gs:// by the Run:ai "
        "model streamer (lesson 15).",
    )
    mount_path: str = Field("/mnt/models", description="Where the Cloud Storage volume is mounted.")
    compile_cache: bool = Field(
        False,
        description="Keep vLLM's compile cache (torch.compile and Inductor's kernels) in the model bucket, one folder "
        "per image, commit and configuration, mounted read-write at /mnt/compile-cache: the first start compiles "
        "and saves it, later ones restore it. Needs vllm.enforce_eager off; the serving account may then write "
        "under compile-cache/ in the bucket, nowhere else. Measure it with the cold-start flow.",
    )
    gcs_buffered_read: bool = Field(
        False,
        description="Mount the Cloud Storage volume with gcsfuse's enable-buffered-read (2-5x faster large "
        "sequential reads from gcsfuse v3.3.0; up to 640 MB of the instance's memory; ignored with the file "
        "cache). Off by default: which gcsfuse Cloud Run runs, and which flags it accepts, is not documented.",
    )
    streamer_concurrency: int = Field(
        8, ge=1, le=64,
        description="runai-streamer: reader threads (RUNAI_STREAMER_CONCURRENCY; the streamer's default from "
        "object storage is 8).",
    )  # fmt: skip
    streamer_memory_gib: float | None = Field(
        None, gt=0,
        description="runai-streamer: its buffer (RUNAI_STREAMER_MEMORY_LIMIT), counted against the instance's "
        "memory (run-ai/runai-model-streamer issue 76: buffers beyond it kill the instance). Empty: a quarter of "
        "memory_gib (the streamer's own default, 40 GB, exceeds most instances).",
    )  # fmt: skip
    load_rate_mb_s: float = Field(
        150,
        gt=0,
        description="Expected weight load throughput; sizes the startup probe window (twice the expected load). "
        "Google publishes no per-instance figure for Cloud Run's Cloud Storage volumes; gcsfuse's benchmarks reach "
        "GB/s only with many parallel readers, and a field report streamed 593 MiB/s from gs:// with the Run:ai "
        "streamer (sglang issue 22749): 150 MB/s is our single-stream assumption. Measure vLLM's 'Loading weights "
        "took' line on a first revision and set it.",
    )
    image: str | None = Field(
        MODEL_GARDEN_VLLM_IMAGE,
        description="Prebuilt image, pinned. GPUs default to Google's Model Garden vLLM image (lesson 1).",
    )
    build: ImageBuild | None = Field(
        None, description="Build the image with Cloud Build instead of using a prebuilt one (e.g. the vllm-cpu recipe)."
    )
    allow_generic_vllm_image: bool = Field(
        False,
        description="Allow vllm/vllm-openai on an L4 although its CUDA is newer than the L4 driver (lesson 1).",
    )
    vllm: VllmOptions = Field(default_factory=VllmOptions, description="vLLM engine options.")
    gpu_hourly_usd: float | None = Field(None, ge=0, description="GPU price per hour; the catalogue's when empty.")
    vcpu_second_usd: float = Field(VCPU_SECOND_USD, ge=0, description="Price per vCPU-second.")
    gib_second_usd: float = Field(GIB_SECOND_USD, ge=0, description="Price per GiB-second.")

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if key == "PORT":
                raise ValueError("env: PORT is set by Cloud Run from container_port; set container_port instead")
            if key in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
                raise ValueError(
                    f"env: {key} must not be stored in plain text; set hf_token_at_runtime and the pipeline "
                    "passes the token of the model source's Secret block (token_secret_block) through Secret Manager"
                )
            if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", key):
                raise ValueError(f"env: '{key}' is not a valid environment variable name")
        return value

    @field_validator("mount_path")
    @classmethod
    def _mount_path(cls, value: str) -> str:
        if not value.startswith("/") or value.rstrip("/") in ("", "/"):
            raise ValueError(f"mount_path '{value}' must be an absolute directory such as '/mnt/models'")
        if any(value == root or value.startswith(root + "/") for root in DISALLOWED_MOUNT_ROOTS):
            raise ValueError(
                f"mount_path '{value}': Cloud Run refuses mounts under /dev, /proc and /sys (seed 000, /dev/shm); "
                "use e.g. '/mnt/models'"
            )
        return value.rstrip("/")

    @model_validator(mode="after")
    def _consistent(self) -> ServingProfile:
        if self.gpu_type is not None:
            gpu = GPUS[self.gpu_type]
            if self.cpu < gpu.min_cpu:
                raise ValueError(f"cpu: {self.gpu_type} needs at least {gpu.min_cpu} vCPU; set cpu to {gpu.min_cpu}")
            if self.memory_gib < gpu.min_memory_gib:
                raise ValueError(
                    f"memory_gib: {self.gpu_type} needs at least {gpu.min_memory_gib} GiB; set memory_gib to "
                    f"{gpu.min_memory_gib} or more"
                )
            if not self.cpu_always_allocated:
                raise ValueError("cpu_always_allocated: GPU services need CPU always allocated; set it to true")
        if self.min_instances > self.max_instances:
            raise ValueError(
                f"min_instances ({self.min_instances}) is above max_instances ({self.max_instances}); lower "
                "min_instances or raise max_instances"
            )
        if self.compile_cache:
            self._check_compile_cache()
        if (self.image is None) == (self.build is None):
            raise ValueError("image and build: set exactly one (a pinned prebuilt image, or how to build one)")
        return self

    def _check_compile_cache(self) -> None:
        if self.vllm.enforce_eager:
            raise ValueError(
                "compile_cache: an eager engine compiles nothing to keep; set vllm.enforce_eager to false, or "
                "compile_cache to false"
            )
        taken = sorted({"VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "VLLM_USE_AOT_COMPILE"} & set(self.env))
        if taken:
            raise ValueError(f"env: {', '.join(taken)} is set by compile_cache; remove it from env")
        if self.mount_path == COMPILE_CACHE_MOUNT or self.mount_path.startswith(COMPILE_CACHE_MOUNT + "/"):
            raise ValueError(f"mount_path '{self.mount_path}' is where compile_cache mounts; use e.g. '/mnt/models'")

    @property
    def effective_concurrency(self) -> int:
        """Requests per instance: the explicit setting, else twice max_num_seqs (lesson 20), at most 1000."""
        return self.concurrency or min(2 * self.vllm.max_num_seqs, MAX_CONCURRENCY)

    @property
    def hourly_usd(self) -> float:
        """Price of one instance-hour at this profile's sizes."""
        gpu = 0.0
        if self.gpu_type is not None:
            gpu = self.gpu_hourly_usd if self.gpu_hourly_usd is not None else GPUS[self.gpu_type].hourly_usd
        return gpu + 3600 * (self.cpu * self.vcpu_second_usd + self.memory_gib * self.gib_second_usd)

    @classmethod
    def preset(cls, name: str, **overrides: object) -> ServingProfile:
        """A preset by name (``l4``, ``rtx-pro-6000``, ``cpu``), with field overrides."""
        try:
            base = PRESETS[name]
        except KeyError:
            raise ValueError(f"profile '{name}' is not a preset; choose one of {', '.join(PRESETS)}") from None
        return cls.model_validate({**base, "name": name, **overrides})


PRESETS: dict[str, dict] = {
    # Seed 000's working GPU deploy: 8 vCPU / 32 GiB, one L4, zonal redundancy off, eager mode.
    "l4": {"cpu": 8, "memory_gib": 32, "gpu_type": "nvidia-l4", "max_instances": 1},
    # Seed 001: 20 vCPU / 80 GiB minimum, needs --no-gpu-zonal-redundancy; RTX quota is often 1.
    "rtx-pro-6000": {
        "cpu": 20,
        "memory_gib": 80,
        "gpu_type": "nvidia-rtx-pro-6000",
        "max_instances": 1,
    },
    # Seed 000's CPU mode: 4 vCPU / 10 GiB, vLLM built from Dockerfile.cpu, the in-process engine env.
    "cpu": {
        "cpu": 4,
        "memory_gib": 10,
        "gpu_type": None,
        "max_instances": 1,
        "env": CPU_MODE_ENV,
        "image": None,
        "build": {"recipe": "vllm-cpu"},
        "load_rate_mb_s": 100,
        "vllm": {"max_model_len": 2048, "max_num_seqs": 8, "dtype": "bfloat16"},
    },
}
