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

SPEC = Path(__file__).resolve().parent.parent / "deployments" / "sandbox" / "tiny-chat.yaml"
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
    return {"uploads": len(uploads), "builds": len(builds)}


def _revisions(target, service: str) -> int:
    from tasks.common import clients

    parent = f"{target.location_path}/services/{service}"
    try:
        return len(list(clients.run_revisions(target).list_revisions(parent=parent)))
    except Exception:  # no service yet
        return 0


def _build_profile(scratch: Path) -> str:
    """A ServingProfile block (l4) whose image Cloud Build builds from a local folder."""
    source = scratch / "image-source"
    source.mkdir(exist_ok=True)
    (source / "Dockerfile").write_text("FROM python:3.12-slim\nCOPY . /app\n")
    (source / "app.py").write_text("print('bench')\n")
    ServingProfile.preset("l4", image=None, build={"source_dir": str(source), "image_name": "bench-built"}).save(
        "bench-built", overwrite=True
    )
    return "bench-built"


def promotion_figures(sb, scratch: Path) -> dict:
    """For a pinned image and for one Cloud Build builds: the first promotion, then the same inputs again."""
    from flows.common import load_target
    from flows.promote import promote_model
    from tasks.deploy.probe import VerifyOptions

    verify = VerifyOptions(health_period_s=0.05)
    target = load_target("sandbox")
    pairs = {
        "pinned image": {"spec_file": str(SPEC)},
        "built image": {"spec_file": str(SPEC), "service": "tiny-chat-built", "profile": _build_profile(scratch)},
    }
    figures: dict[str, dict] = {}
    for pair, params in pairs.items():
        service = params.get("service", "tiny-chat")
        for label in ("first", "again"):
            since, revisions_before = sb.last_request_seq(), _revisions(target, service)
            started = time.perf_counter()
            report = promote_model(verify=verify, **params)
            wall = time.perf_counter() - started
            steps = sum(step.seconds for step in report.steps)
            figures.setdefault(pair, {})[label] = {
                "outcome": report.outcome,
                "wall_s": round(wall, 2),
                "steps_s": round(steps, 2),
                "overhead_s": round(wall - steps, 2),
                "bytes_uploaded": report.staging.bytes_uploaded if report.staging else 0,
                "steps": {step.name: step.seconds for step in report.steps},
                "revisions": _revisions(target, service) - revisions_before,
                **_count_writes(sb, since),
            }
    return figures


def readiness_lag(periods: tuple[float, ...] = (0.05, 0.2, 1.0), trials: int = 5) -> list[dict]:
    """Start a vLLM stand-in, note when its port first answers /health (polling every millisecond on another
    thread: the truth), and when the verifier's /health loop at ``period`` notices. Lag vs period."""
    from tasks.deploy.probe import VerifyOptions, wait_healthy

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
    from tasks.report.cost import HOURS_PER_WEEK, estimate

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

    from sandbox.blocks import save_sandbox_blocks
    from sandbox.handle import SandboxHandle
    from sandbox.metadata import point_google_auth_at

    # The candidate's ID tokens come from the sandbox's metadata server, as on a Cloud Run worker.
    metadata_port = point_google_auth_at()
    with (
        tempfile.TemporaryDirectory(prefix="bench-promotion-") as scratch,
        SandboxHandle.start(Path(scratch) / "sandbox", "--metadata-port", str(metadata_port)) as sb,
        prefect_test_harness(),
    ):
        os.environ["HF_ENDPOINT"] = sb.hub_url
        save_sandbox_blocks(Path(scratch) / "sandbox")
        promotion = promotion_figures(sb, Path(scratch))
    lag = readiness_lag()
    cost = cost_figures()
    print(f"machine: {os.cpu_count()} cores, Python {sys.version.split()[0]}\n")
    print("| promotion | outcome | wall s | steps s | overhead s | bytes uploaded | uploads | builds | revisions |")
    print("|---|---|---|---|---|---|---|---|---|")
    for pair, runs in promotion.items():
        for label, run in runs.items():
            print(f"| {pair}, {label} | {run['outcome']} | {run['wall_s']} | {run['steps_s']} | {run['overhead_s']} | "
                  f"{run['bytes_uploaded']} | {run['uploads']} | {run['builds']} | {run['revisions']} |")  # fmt: skip
    for pair, runs in promotion.items():
        first, again = runs["first"], runs["again"]
        print(f"\n{pair}: re-promotion / first wall time {again['wall_s'] / first['wall_s']:.2f}; bytes uploaded "
              f"{again['bytes_uploaded']} vs {first['bytes_uploaded']}; builds {again['builds']} vs {first['builds']}; "
              f"revisions {again['revisions']} vs {first['revisions']}")  # fmt: skip
    first = promotion["built image"]["first"]
    print("\n| step (built image, first promotion) | s | share of wall time |")
    print("|---|---|---|")
    for name, seconds in first["steps"].items():
        print(f"| {name} | {seconds} | {seconds / first['wall_s']:.2f} |")
    print(f"| sum of steps | {first['steps_s']} | {first['steps_s'] / first['wall_s']:.2f} |")
    print(f"| orchestration (flow, task runs, artifacts, events) | {first['overhead_s']} | "
          f"{first['overhead_s'] / first['wall_s']:.2f} |\n")  # fmt: skip
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
