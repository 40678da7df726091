"""Preflight: the field lessons as checks on the profile and the rendered service, before any cloud call.

Each finding names the setting and the fix. Errors block the promotion; warnings go into the report. Checks
that need the model (weights against GPU memory, the KV cache budget) run once the Hub listing and config
are known (`ModelFacts`), still before anything is staged or deployed.
"""

from __future__ import annotations

from dataclasses import dataclass

from google.cloud import run_v2

from blocks.hardware import GPUS, MODEL_GARDEN_VLLM_IMAGE, container_cpus, instance_cpu_limit, size_problem
from blocks.profile import CPU_MODE_ENV, DISALLOWED_MOUNT_ROOTS, MAX_CONCURRENCY, ServingProfile
from blocks.target import GcpTarget
from tasks.checks.findings import Finding, PreflightError, error, warning
from tasks.checks.vllm_rules import model_rules, profile_rules
from tasks.common.naming import CANDIDATE_TAG, SERVICE_ID
from tasks.deploy.metrics_sidecar import SCRAPE_PORT, nearest_split, split_instance
from tasks.deploy.render import (
    COMPILE_S,
    CPU_PROBE_LIMIT_S,
    ENGINE_START_S,
    GPU_PROBE_LIMIT_S,
    PROBE_INITIAL_DELAY_S,
    PROBE_PERIOD_S,
    probe_failure_threshold,
    running_value,
    streamer_memory_gib,
)
from tasks.deploy.vllm_argv import flag_value
from tasks.image.image_reference import same_repository
from tasks.image.images import check_local_source, prebuilt_findings

RUNTIME_MEMORY_GIB = 4  # Python, CUDA context and the server, besides the weights, when they sit in RAM
DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2, "auto": 2}
KV_DTYPE_BYTES = {"auto": None, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}
ONLINE_QUANT_BYTES = {"fp8": 1.0, "bitsandbytes": 0.5}  # bytes per parameter when vLLM quantizes while loading
MEMORY_BACKED = ("/tmp", "/dev/shm")


@dataclass(frozen=True)
class ModelFacts:
    """What preflight knows about the model once it is resolved: staged bytes and its config.json."""

    weights_bytes: int
    config: dict | None = None


def check_profile(profile: ServingProfile, target: GcpTarget, service_id: str) -> list[Finding]:
    """Checks on settings alone."""
    findings = [error("image", text.removeprefix("image: "), 1) for text in prebuilt_findings(profile)]
    findings += check_streamer_memory(profile)
    findings += _gpu_findings(profile, target) if profile.gpu_type else _cpu_findings(profile)
    findings += check_container_sizes(profile)
    findings += _concurrency_findings(profile) + _service_name_findings(service_id)
    if profile.build is not None:
        try:
            check_local_source(profile.build)
        except ValueError as exc:
            findings.append(error("build", str(exc)))
    findings += profile_rules(profile)  # what vLLM and the instance refuse (vLLM's own rules, v0.33.0)
    cache = _weights_cache(profile)
    if cache and cache.startswith(MEMORY_BACKED):
        findings.append(
            warning(
                "vllm.extra_args",
                f"{cache} is memory-backed on Cloud Run: weights copied there count against memory_gib "
                f"({profile.memory_gib} GiB); preflight checks the size once the model is known",
                13,
            )
        )
    return findings


def _weights_cache(profile: ServingProfile) -> str | None:
    """Where vLLM would copy weights: the --download-dir it runs with, else HF_HOME."""
    return running_value(profile, "--download-dir") or profile.env.get("HF_HOME")


def _gpu_findings(profile: ServingProfile, target: GcpTarget) -> list[Finding]:
    """The GPU exists in the region and deploys without zonal redundancy where it must. Its quota is judged with
    the region's other quotas, by the project's figure (tasks/checks/quotas.check_region_quotas)."""
    assert profile.gpu_type is not None
    findings: list[Finding] = []
    gpu = GPUS[profile.gpu_type]
    if target.region not in gpu.regions:
        findings.append(
            error(
                "gpu_type",
                f"{profile.gpu_type} is not offered in {target.region}; use a region with it "
                f"({', '.join(sorted(gpu.regions))}) or another GPU type",
            )
        )
    if profile.gpu_type == "nvidia-rtx-pro-6000" and profile.gpu_zonal_redundancy:
        findings.append(
            error(
                "gpu_zonal_redundancy",
                "RTX Pro 6000 deploys need zonal redundancy off (--no-gpu-zonal-redundancy): projects have no "
                "quota for it; set gpu_zonal_redundancy to false",
                13,
            )
        )
    return findings


def _cpu_findings(profile: ServingProfile) -> list[Finding]:
    """A CPU-only service has the environment vLLM's in-process engine needs on Cloud Run."""
    missing = {k: v for k, v in CPU_MODE_ENV.items() if k != "VLLM_CPU_KVCACHE_SPACE" and profile.env.get(k) != v}
    if not missing:
        return []
    wanted = ", ".join(f"{k}={v}" for k, v in missing.items())
    return [
        error(
            "env",
            f"a CPU-only service needs {wanted}: Cloud Run's /dev/shm is too small for vLLM's "
            "multiprocessing and cannot be mounted over; start from the cpu preset",
            9,
        )
    ]


def _concurrency_findings(profile: ServingProfile) -> list[Finding]:
    """Cloud Run sends an instance enough requests to fill vLLM's batch, and no batch is larger than it can send."""
    if profile.vllm.max_num_seqs > MAX_CONCURRENCY:
        return [
            error(
                "vllm.max_num_seqs",
                f"{profile.vllm.max_num_seqs} is above the {MAX_CONCURRENCY} requests Cloud Run sends one instance "
                f"at once: the batch never fills; lower max_num_seqs to {MAX_CONCURRENCY} or less",
                20,
            )
        ]
    if profile.effective_concurrency < profile.vllm.max_num_seqs:
        # A GPU paid for a batch it never gets: Cloud Run queues or scales out before vLLM is full.
        return [
            error(
                "concurrency",
                f"{profile.effective_concurrency} is below vllm.max_num_seqs ({profile.vllm.max_num_seqs}): Cloud "
                "Run never sends enough requests to fill a batch; leave concurrency empty for twice max_num_seqs",
                20,
            )
        ]
    return []


def _service_name_findings(service_id: str) -> list[Finding]:
    """The service id is a Cloud Run name, short enough for its candidate tag's URL."""
    findings: list[Finding] = []
    if not SERVICE_ID.match(service_id):
        findings.append(
            error(
                "service",
                f"'{service_id}' is not a Cloud Run service name: use lowercase letters, digits and hyphens, starting "
                "with a letter and not ending with a hyphen (e.g. the default derived from the model)",
            )
        )
    if len(service_id) + len(CANDIDATE_TAG) > 46:
        findings.append(
            error(
                "service",
                f"'{service_id}' is too long for its '{CANDIDATE_TAG}' tag URL (tag plus service name at most 46 "
                f"characters); use at most {46 - len(CANDIDATE_TAG)} characters",
            )
        )
    return findings


def check_service(profile: ServingProfile, service: run_v2.Service) -> list[Finding]:
    """Checks on the rendered service: what would actually be sent."""
    findings: list[Finding] = check_containers(profile, service)
    template = service.template
    container = next((c for c in template.containers if c.ports), template.containers[0])
    args = list(container.args)
    if same_repository(container.image, MODEL_GARDEN_VLLM_IMAGE) and args[:2] != ["vllm", "serve"]:
        findings.append(
            error(
                "args",
                f"{MODEL_GARDEN_VLLM_IMAGE.split(':')[0]} execs its args: they must begin 'vllm serve', or the "
                "container dies with 'serve: command not found'",
                2,
            )
        )
    if any(a == "--model" or a.startswith("--model=") for a in args):
        findings.append(error("args", "vllm serve takes the model positionally, not --model=; drop --model", 5))
    port = flag_value(args, "--port")  # the last --port, as vLLM's parser keeps
    container_port = container.ports[0].container_port if container.ports else 8080
    if port is not None and port != str(container_port):
        findings.append(
            error(
                "container_port",
                f"vLLM listens on {port} but Cloud Run routes to {container_port}; the startup probe never passes. "
                "Keep --port equal to container_port",
                4,
            )
        )
    probe = container.startup_probe
    window = probe.initial_delay_seconds + probe.period_seconds * probe.failure_threshold
    if not profile.vllm.enforce_eager and window < 360:
        findings.append(
            error(
                "vllm.enforce_eager",
                f"without --enforce-eager the first boot compiles for over 5 minutes but the probe allows {window} s; "
                "turn enforce_eager on, or lengthen the probe window to at least 6 minutes",
                3,
            )
        )
    limit = GPU_PROBE_LIMIT_S if profile.gpu_type else CPU_PROBE_LIMIT_S
    if probe.period_seconds * probe.failure_threshold > limit:
        findings.append(
            error(
                "startup probe",
                f"failureThreshold x periodSeconds = {probe.period_seconds * probe.failure_threshold} s is above "
                f"Cloud Run's {limit} s; raise load_rate_mb_s or use a bigger profile",
            )
        )
    for mount in container.volume_mounts:
        if any(mount.mount_path == r or mount.mount_path.startswith(r + "/") for r in DISALLOWED_MOUNT_ROOTS):
            findings.append(
                error("mount_path", f"Cloud Run refuses mounts under /dev, /proc, /sys ({mount.mount_path})", 9)
            )
    model = args[2] if args[:2] == ["vllm", "serve"] and len(args) > 2 else (args[0] if args else "")
    env = {e.name: e.value for e in container.env}
    if model and not model.startswith(("/", "gs://")) and "MODEL_PATH" not in env:
        findings.append(
            error("args", f"model '{model}' is a Hub id: the container would download it at boot; stage it", 11)
        )
    if env.get("HF_HUB_OFFLINE") != "1" and not profile.hf_token_at_runtime:
        findings.append(warning("env", "HF_HUB_OFFLINE is not 1: a missing file would be fetched from the Hub", 11))
    return findings + check_runtime_hub(service)


def check_containers(profile: ServingProfile, service: run_v2.Service) -> list[Finding]:
    """Cloud Run's rules for several containers (one ingress container: the only one with a port; sidecars start
    after what they depend on) and what the metrics sidecar needs to find vLLM (tasks/deploy/metrics_sidecar.py)."""
    containers = list(service.template.containers)
    findings: list[Finding] = []
    ingress = [c.name for c in containers if c.ports]
    if len(ingress) != 1:
        findings.append(error("containers", f"exactly one container must expose a port; {ingress or 'none'} do"))
    names = {c.name for c in containers}
    for container in containers:
        unknown = [d for d in container.depends_on if d not in names or d == container.name]
        if unknown:
            findings.append(error("containers", f"{container.name} depends on {unknown}: not another container"))
    if profile.metrics != "vllm":
        return findings
    if profile.container_port != SCRAPE_PORT:
        findings.append(
            error(
                "container_port",
                f"metrics: vllm: the Prometheus sidecar's default config scrapes port {SCRAPE_PORT} only (sidecars "
                f"get no PORT), but vLLM listens on {profile.container_port}; set container_port to {SCRAPE_PORT}",
            )
        )
    if not profile.cpu_always_allocated:
        findings.append(
            warning(
                "cpu_always_allocated",
                "metrics: vllm: Google recommends instance-based billing for the Prometheus sidecar, or scrapes of an "
                "idle instance may be throttled and lost; set cpu_always_allocated to true",
            )
        )
    return findings


def check_container_sizes(profile: ServingProfile) -> list[Finding]:
    """The instance as Cloud Run sizes containers: each one on its own (whole vCPUs of 1, 2, 4, 6 or 8, memory per
    vCPU, the GPU's container at its GPU's minimums; blocks/hardware.py), so a profile Cloud Run would refuse at
    deploy, after the weights are staged and the image built, is refused here with the nearest totals it takes."""
    sidecar = profile.metrics == "vllm"
    if split_instance(profile.cpu, profile.memory_gib, profile.gpu_type, sidecar) is not None:
        return []
    cpu, memory_gib, split = nearest_split(profile.cpu, profile.memory_gib, profile.gpu_type, sidecar)
    field = "cpu" if cpu != profile.cpu else "memory_gib"
    fix = " and ".join(
        f"{name} to {value}" for name, value, was in (("cpu", cpu, profile.cpu), ("memory_gib", memory_gib,
        profile.memory_gib)) if value != was
    )  # fmt: skip
    vllm = f"vLLM {split.vllm_cpu} vCPU / {split.vllm_memory_mib / 1024:g} GiB"
    if not sidecar:
        problem = size_problem(profile.cpu, profile.memory_gib * 1024, profile.gpu_type) or (
            f"an instance may have at most {instance_cpu_limit(profile.gpu_type)} vCPU"
        )
        return [error(field, f"Cloud Run refuses {profile.cpu} vCPU / {profile.memory_gib} GiB: {problem}; set {fix}")]
    gpu = profile.gpu_type
    holder = f"vLLM's container, holding the {gpu}, takes" if gpu else "vLLM's container takes"
    least = f" and at least {GPUS[gpu].min_memory_gib} GiB" if gpu else ""
    return [
        error(
            field,
            f"metrics: vllm: Cloud Run sizes each container on its own: {holder} "
            f"{', '.join(map(str, container_cpus(gpu)))} vCPU{least}, at most 4 GiB per vCPU, the collector's 1, 2, 4, "
            f"6 or 8 vCPU, and {profile.cpu} vCPU / {profile.memory_gib} GiB split into no such pair; set {fix} "
            f"({vllm}, the collector {split.sidecar_cpu} vCPU / {split.sidecar_memory_mib / 1024:g} GiB)",
        )
    ]


def check_runtime_hub(service: run_v2.Service) -> list[Finding]:
    """Runtime Hub access (HF_TOKEN in the container) needs a way out: no HF_HUB_OFFLINE=1, and egress that
    reaches the internet. Direct VPC egress with ALL_TRAFFIC has none without Cloud NAT (Cloud Run networking
    best practices); the renderer picks PRIVATE_RANGES_ONLY for hf_token_at_runtime (tasks/deploy/render.py,
    vpc_egress), so this refuses a spec that was edited or rendered otherwise."""
    template = service.template
    container = template.containers[0]
    names = {e.name for e in container.env}
    if "HF_TOKEN" not in names:
        return []
    findings = []
    env = {e.name: e.value for e in container.env if not e.value_source}
    if env.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        findings.append(
            error(
                "hf_token_at_runtime",
                "the container gets HF_TOKEN to reach the Hub at runtime, but HF_HUB_OFFLINE=1 refuses every Hub "
                "call; remove HF_HUB_OFFLINE from the profile's env, or turn hf_token_at_runtime off",
                11,
            )
        )
    vpc = template.vpc_access
    if (vpc.network_interfaces or vpc.connector) and vpc.egress == run_v2.VpcAccess.VpcEgress.ALL_TRAFFIC:
        findings.append(
            error(
                "hf_token_at_runtime",
                "the container gets HF_TOKEN to reach the Hub at runtime, but Direct VPC egress ALL_TRAFFIC sends "
                "every packet into the VPC, which has no internet without Cloud NAT: render the service with "
                "PRIVATE_RANGES_ONLY egress (the pipeline does for hf_token_at_runtime), or turn "
                "hf_token_at_runtime off and keep the weights staged",
                15,
            )
        )
    return findings


def kv_bytes_per_token(config: dict, kv_cache_dtype: str, dtype: str) -> int | None:
    """Key and value bytes per token across layers, from the model's config.json."""
    try:
        layers = int(config["num_hidden_layers"])
        heads = int(config["num_attention_heads"])
        kv_heads = int(config.get("num_key_value_heads", heads))
        head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None
    element = KV_DTYPE_BYTES.get(kv_cache_dtype) or DTYPE_BYTES.get(dtype, 2)
    return 2 * layers * kv_heads * head_dim * element


def loaded_weight_bytes(profile: ServingProfile, facts: ModelFacts) -> float:
    """GPU bytes the weights take once loaded: the staged bytes, rescaled from the checkpoint's dtype (config.json
    torch_dtype, 16-bit when unknown) to the served one, or to a quantization vLLM applies while loading. A
    checkpoint quantized already (a quantization_config in config.json: AWQ, GPTQ, ...) loads at its size."""
    config = facts.config or {}
    if config.get("quantization_config"):
        return facts.weights_bytes
    stored = DTYPE_BYTES.get(str(config.get("torch_dtype") or config.get("dtype") or "bfloat16"), 2)
    opts = profile.vllm
    served = ONLINE_QUANT_BYTES.get(opts.quantization or "")
    if served is None:
        served = min(stored, 2) if opts.dtype == "auto" else DTYPE_BYTES.get(opts.dtype, 2)  # auto: fp32 -> 16-bit
    return facts.weights_bytes / stored * served


def check_model(profile: ServingProfile, facts: ModelFacts) -> list[Finding]:
    """Checks that need the model's size and config."""

    # config.json is untrusted: a broken or absurd one stops here, before its numbers size memory or probes.
    findings: list[Finding] = model_rules(profile, facts.config)
    if any(f.severity == "error" and f.setting.startswith("config.json") for f in findings):
        return findings
    opts = profile.vllm
    weights = loaded_weight_bytes(profile, facts)
    gib = 2**30
    cache = _weights_cache(profile)
    if (
        cache
        and cache.startswith(MEMORY_BACKED)
        and facts.weights_bytes / gib + RUNTIME_MEMORY_GIB > profile.memory_gib
    ):
        findings.append(
            error(
                "memory_gib",
                f"copying {facts.weights_bytes / gib:.1f} GiB of weights to {cache} (memory-backed) plus "
                f"~{RUNTIME_MEMORY_GIB} GiB of runtime exceeds {profile.memory_gib} GiB; load from the volume instead "
                "or use a bigger profile",
                13,
            )
        )
    threshold = probe_failure_threshold(profile, facts.weights_bytes)
    window = PROBE_INITIAL_DELAY_S + PROBE_PERIOD_S * threshold
    expected = ENGINE_START_S + facts.weights_bytes / (profile.load_rate_mb_s * 1e6)
    expected += 0 if opts.enforce_eager else COMPILE_S
    if expected > window:
        findings.append(
            warning(
                "load_rate_mb_s",
                f"loading is expected to take ~{expected:.0f} s at {profile.load_rate_mb_s} MB/s, but Cloud Run's "
                f"startup probe allows at most {window} s: raise load_rate_mb_s if the storage is faster (runai "
                "streamer, Direct VPC egress), or serve a smaller or quantized model",
                12,
            )
        )
    if profile.gpu_type is None:
        return findings
    gpu_bytes = GPUS[profile.gpu_type].memory_gb * 1e9 * opts.gpu_memory_utilization
    if weights > gpu_bytes:
        findings.append(
            error(
                "gpu_type",
                f"the weights need {weights / 1e9:.1f} GB at dtype {opts.dtype}"
                + (f" with {opts.quantization}" if opts.quantization else "")
                + f" but {profile.gpu_type} offers "
                f"{gpu_bytes / 1e9:.1f} GB at gpu_memory_utilization {opts.gpu_memory_utilization}; choose a quantized "
                "model or a bigger GPU",
            )
        )
        return findings
    per_token = kv_bytes_per_token(facts.config or {}, opts.kv_cache_dtype, opts.dtype) if facts.config else None
    if per_token is None or opts.max_model_len is None:
        return findings
    budget = gpu_bytes - weights
    one = opts.max_model_len * per_token
    if one > budget:
        findings.append(
            error(
                "vllm.max_model_len",
                f"one {opts.max_model_len}-token sequence needs {one / 1e9:.2f} GB of KV cache, {budget / 1e9:.2f} GB "
                "is left after the weights; lower max_model_len or use kv_cache_dtype fp8",
                20,
            )
        )
    elif one * opts.max_num_seqs > budget:
        findings.append(
            warning(
                "vllm.max_num_seqs",
                f"{opts.max_num_seqs} sequences of {opts.max_model_len} tokens need "
                f"{one * opts.max_num_seqs / 1e9:.1f} GB of KV cache, {budget / 1e9:.1f} GB is left: vLLM will run "
                "fewer at once; lower max_num_seqs or max_model_len",
                20,
            )
        )
    return findings


# What the instance needs beside the streamer's buffer: the vLLM process, the tokenizer, a CUDA context, the
# sidecar's share. Our estimate, not a measured or published figure.
HOST_RESERVE_GIB = 4


def check_streamer_memory(profile: ServingProfile) -> list[Finding]:
    """runai-streamer's buffer lives in the instance's memory with everything else; one beyond it kills the
    instance while it loads (run-ai/runai-model-streamer issue 76: each worker's buffer, silently, 10 % in)."""
    if profile.load_mode != "runai-streamer":
        return []
    buffer = streamer_memory_gib(profile)
    room = profile.memory_gib - HOST_RESERVE_GIB
    if buffer <= room:
        return []
    return [error(
        "streamer_memory_gib",
        f"the Run:ai streamer's buffer of {buffer:g} GiB (RUNAI_STREAMER_MEMORY_LIMIT) and the {HOST_RESERVE_GIB} "
        f"GiB the instance needs beside it exceed memory_gib {profile.memory_gib}; set streamer_memory_gib to "
        f"{room:g} or less (empty: a quarter of memory_gib), or raise memory_gib",
        15,
    )]  # fmt: skip


def raise_on_errors(findings: list[Finding]) -> list[Finding]:
    """The findings, if none is an error; PreflightError otherwise."""
    if any(f.severity == "error" for f in findings):
        raise PreflightError(findings)
    return findings


def check_candidate_quota(
    profile: ServingProfile, rollout: str, canary: list[int], serving: bool, quota: int | None, region: str,
    quota_id: str,
) -> list[Finding]:  # fmt: skip
    """The candidate runs beside the serving revision (zero-downtime, and every canary step), whose `previous` tag
    then stays warm through the watch: it needs a GPU the serving revision does not hold (``quota`` in GPUs; -1 or
    None: no limit). On a quota of 1 that is never there; above, only when the serving revision is not at its
    maximum. Where it cannot be, the choice is the user's: more quota, or the `replace` rollout, which stops the
    serving revision first (tasks/deploy/rollout.py)."""
    if profile.gpu_type is None:
        return []
    if rollout == "replace":
        if canary:
            return [error("rollout", f"replace stops the serving revision before the candidate starts: there is "
                           f"no traffic to split, so canary {canary} cannot run; leave canary empty, or use the "
                           "zero-downtime rollout", 6)]  # fmt: skip
        return []
    if quota is None or quota == -1:
        return []
    needed = profile.max_instances + 1
    if canary and needed > quota:
        return [error(
            "canary",
            f"{canary} runs the candidate beside the serving revision: {needed} {profile.gpu_type} GPUs at once "
            f"(max_instances {profile.max_instances} + 1), above the region's quota of {quota} ({quota_id}) in "
            f"{region}; leave canary empty (with rollout replace on one GPU), lower max_instances, or request more "
            "quota",
            6,
        )]  # fmt: skip
    if not serving:
        return []  # a first deploy: max_instances alone, checked against the quota by itself
    if quota < 2:
        return [error(
            "rollout",
            f"re-promoting starts the candidate beside the serving revision (zero-downtime): 2 {profile.gpu_type} "
            f"GPUs at once at the least, above the region's quota of {quota} ({quota_id}) in {region}. Either "
            f"request {quota_id} of {needed} GPUs for {region}, or set rollout to replace: the serving revision is "
            "stopped first and the service answers 503 until the candidate is verified and takes all traffic (its "
            "start-up: the model's load, minutes on a GPU)",
            6,
        )]  # fmt: skip
    if needed > quota:
        return [warning(
            "rollout",
            f"the candidate starts beside the serving revision: if that one is at its max_instances "
            f"({profile.max_instances}) it holds all {quota} {profile.gpu_type} GPUs of {quota_id} in {region}, and "
            f"the candidate cannot start (Cloud Run: \"Quota exceeded for total allowable count of GPUs per project "
            f"per region.\"); request {needed}, or promote at a quiet hour",
            6,
        )]  # fmt: skip
    return []
