"""Promotion figures, measured side by side in one run against the sandbox:

- re-promotion of unchanged inputs vs the first promotion: wall time, bytes uploaded, builds, revisions;
- orchestration overhead: the flow's wall time against the sum of its steps' own durations;
- readiness detection lag: how long after a server starts answering /health the verifier notices, vs its period;
- cost: instance hours per week and money per month under the default schedule vs always on.

    python -m bench.promotion [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from blocks import ServingProfile
from sandbox.serving import free_port

SPEC = Path(__file__).resolve().parent.parent / "deployments" / "tiny-chat.yaml"
# The container contract of sandbox/vllm: an L4 instance running an image built for its CUDA.
STANDIN_ENV = {
    "PORT": "8080",
    "SANDBOX_IMAGE_ENTRYPOINT": "vllm-serve",
    "SANDBOX_TIME_SCALE": "0.01",
    "SANDBOX_ACCELERATOR": "nvidia-l4",
    "SANDBOX_DRIVER_CUDA": "12020",
    "SANDBOX_IMAGE_CUDA": "12020",
}


def _count_writes(sb, since: int) -> dict[str, int]:
    requests = sb.requests(since=since)
    uploads = [
        r for r in requests if r["server"] == "gcs" and r["method"] in ("POST", "PUT") and "/upload/" in r["path"]
    ]
    builds = [r for r in requests if r["method"] == "POST" and r["path"].endswith("/builds")]
    revisions = [r for r in requests if r["method"] in ("POST", "PATCH") and "/services" in r["path"]
                 and r["server"] == "control" and "updateMask=traffic" not in r["query"]
                 and "updateMask=scaling" not in r["query"]]  # fmt: skip
    return {"uploads": len(uploads), "builds": len(builds), "service_writes": len(revisions)}


def promotion_figures(sb) -> dict:
    """First promotion, then the same inputs again, through the promote-model flow."""
    from flows.promote import promote_model
    from tasks.probe import VerifyOptions

    verify = VerifyOptions(health_period_s=0.05)
    runs = {}
    for label in ("first", "again"):
        since = sb.last_request_seq()
        started = time.perf_counter()
        report = promote_model(spec_file=str(SPEC), verify=verify)
        wall = time.perf_counter() - started
        steps = sum(step.seconds for step in report.steps)
        runs[label] = {
            "outcome": report.outcome,
            "wall_s": round(wall, 2),
            "steps_s": round(steps, 2),
            "overhead_s": round(wall - steps, 2),
            "bytes_uploaded": report.staging.bytes_uploaded if report.staging else 0,
            "steps": {step.name: step.seconds for step in report.steps},
            **_count_writes(sb, since),
        }
    return runs


def readiness_lag(periods: tuple[float, ...] = (0.05, 0.2, 1.0), trials: int = 5) -> list[dict]:
    """Start a vLLM stand-in, note when its port first answers /health (polling every millisecond on another
    thread: the truth), and when the verifier's /health loop at ``period`` notices. Lag vs period."""
    from tasks.probe import VerifyOptions, wait_healthy

    results = []
    with tempfile.TemporaryDirectory() as scratch:
        model = _tiny_model(Path(scratch))
        for period in periods:
            lags = []
            for _ in range(trials):
                port = free_port()
                env = {
                    **os.environ,
                    **STANDIN_ENV,
                    "SANDBOX_PORT_MAP": json.dumps({"8080": port}),
                    "SANDBOX_ROOT": scratch,
                }
                child = subprocess.Popen(
                    [sys.executable, "-m", "sandbox.vllm", str(model), "--port", "8080", "--enforce-eager"],
                    env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                )  # fmt: skip
                truth: list[float] = []
                threading.Thread(target=_first_health, args=(port, truth), daemon=True).start()
                with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=1) as client:
                    wait_healthy(client, VerifyOptions(health_period_s=period, health_window_s=60))
                noticed = time.monotonic()
                deadline = noticed + 5
                while not truth and time.monotonic() < deadline:
                    time.sleep(0.001)
                child.terminate()
                child.wait()
                if truth:
                    lags.append(max(noticed - truth[0], 0.0))
            results.append({
                "period_s": period,
                "mean_lag_s": round(statistics.mean(lags), 4),
                "max_lag_s": round(max(lags), 4),
                "mean_lag_over_period": round(statistics.mean(lags) / period, 2),
            })  # fmt: skip
    return results


def _first_health(port: int, truth: list[float]) -> None:
    deadline = time.monotonic() + 60
    with httpx.Client(timeout=0.2) as client:
        while time.monotonic() < deadline:
            try:
                if client.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                    truth.append(time.monotonic())
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.001)


def _tiny_model(folder: Path) -> Path:
    from tests.support.models import tiny_model_files

    model = folder / "models" / "tiny"
    model.mkdir(parents=True)
    for name, data in tiny_model_files().items():
        (model / name).write_bytes(data)
    return Path("/models/tiny")


def cost_figures(warm_hours_per_week: float = 55) -> list[dict]:
    from tasks.cost import HOURS_PER_WEEK, estimate

    rows = []
    for name in ("l4", "rtx-pro-6000", "cpu"):
        cost = estimate(ServingProfile.preset(name), warm_hours_per_week)
        rows.append({
            "profile": name, "hourly_usd": cost.hourly_usd,
            "instance_hours_per_week": {"scheduled": warm_hours_per_week, "always_on": HOURS_PER_WEEK},
            "monthly_usd": {"scheduled": cost.scheduled_monthly_usd, "always_on": cost.always_on_monthly_usd},
            "saving": round(cost.saving_share, 3),
        })  # fmt: skip
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    from prefect.testing.utilities import prefect_test_harness

    from flows.bootstrap import bootstrap_sandbox, register_block_types
    from sandbox.handle import SandboxHandle

    with (
        tempfile.TemporaryDirectory(prefix="bench-promotion-") as scratch,
        SandboxHandle.start(Path(scratch) / "sandbox") as sb,
        prefect_test_harness(),
    ):
        os.environ["HF_ENDPOINT"] = sb.hub_url
        register_block_types()
        bootstrap_sandbox(Path(scratch) / "sandbox")
        promotion = promotion_figures(sb)
    lag = readiness_lag()
    cost = cost_figures()
    print(f"machine: {os.cpu_count()} cores, Python {sys.version.split()[0]}\n")
    first, again = promotion["first"], promotion["again"]
    print(
        "| promotion | outcome | wall s | steps s | overhead s | bytes uploaded | uploads | builds | service writes |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for label, run in (("first", first), ("same inputs again", again)):
        print(f"| {label} | {run['outcome']} | {run['wall_s']} | {run['steps_s']} | {run['overhead_s']} | "
              f"{run['bytes_uploaded']} | {run['uploads']} | {run['builds']} | {run['service_writes']} |")  # fmt: skip
    print(f"\nre-promotion / first: wall {again['wall_s'] / first['wall_s']:.2f}, bytes "
          f"{again['bytes_uploaded']}/{first['bytes_uploaded']}\n")  # fmt: skip
    print("| verifier period s | mean lag s | max lag s | mean lag / period |")
    print("|---|---|---|---|")
    for row in lag:
        print(f"| {row['period_s']} | {row['mean_lag_s']} | {row['max_lag_s']} | {row['mean_lag_over_period']} |")
    print(
        "\n| profile | $/h | instance h/week scheduled vs always on | $/month scheduled | $/month always on | saving |"
    )
    print("|---|---|---|---|---|---|")
    for row in cost:
        hours = row["instance_hours_per_week"]
        print(f"| {row['profile']} | {row['hourly_usd']:.2f} | {hours['scheduled']:.0f} vs {hours['always_on']} | "
              f"{row['monthly_usd']['scheduled']:,.0f} | {row['monthly_usd']['always_on']:,.0f} | "
              f"{100 * row['saving']:.0f} % |")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps({"promotion": promotion, "readiness": lag, "cost": cost}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
