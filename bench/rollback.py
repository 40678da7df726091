"""Automatic rollback: the time from a client's first bad response to traffic back on the old revision, against the
post-promotion watch's sampling period, measured in one run against the sandbox.

For each Cloud Monitoring visibility delay (simulated seconds; the sampling period is 60 simulated s), a fresh
service is promoted once (the old revision), a background client calls its URL the whole time (one prompt in three
long), and a candidate that passes the probes but answers every long prompt 500 is promoted with the watch on. The
watch (tasks/watch/canary.py) breaches and moves traffic back. Client-side monotonic times:

- t_bad: the client receives its first 5xx (from the candidate);
- t_back: the start of the first request answered by the old revision after which no answer came from the candidate
  (traffic was back by then; the resolution is one request's latency).

time_to_rollback = t_back - t_bad, in seconds and in sampling periods, beside the bound
``period (the bad request's period ends) + delay (its point becomes visible) + period (the watch's next read) +
the traffic update`` (the run_abandon_candidate task's own duration, from Prefect). The watch task's end splits the
figure into detection and traffic update.

Two kinds of bad candidate (``--kinds``): ``5xx`` answers every long prompt 500 to a client of non-streamed chats,
judged on Cloud Run's request metrics; ``stream`` fails every third streamed chat after its 200 (vLLM's error event
inside the stream, invisible to Cloud Run's request metrics) and runs the Prometheus sidecar (metrics: vllm), so the
watch counts the stream errors from vLLM's own metrics. Its bound is the same: the sidecar's 30 s scrape fits in a
sampling period, and the step is judged once Cloud Run's request count shows enough requests.

    python -m bench.rollback [--delays 0,60,180] [--kinds 5xx,stream] [--time-scale 0.01] [--samples 10]
                             [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

# The fault and the client of tests/e2e/test_progressive_delivery.py: the probe's short chat passes, long prompts fail.
FAULT = {"fail_prompts_longer_than": 40}
STREAM_FAULT = {"fail_every_nth_request": 3}  # tests/e2e/test_llm_watch.py's candidate
METRICS_PROFILE = "bench-vllm-metrics"
SLO = {"max_error_ratio": 0.02, "max_p95_ms": "off", "min_requests": 5}
AFTER_S = 0.5  # client traffic kept up after the run fails, so "no candidate answer after t_back" is seen
WALL_MINUS_MONO = time.time() - time.monotonic()  # Prefect's task times are wall clock; the client's monotonic


def _task_times(flow_run_id) -> dict[str, tuple[float, float]]:
    """(start, end) of each task run of the flow run, by task name, on the monotonic clock (last run of a name)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
    times = {}
    for run in sorted(runs, key=lambda r: r.start_time or r.expected_start_time):
        if run.start_time and run.end_time:
            times[run.name.rsplit("-", 1)[0]] = (
                run.start_time.timestamp() - WALL_MINUS_MONO,
                run.end_time.timestamp() - WALL_MINUS_MONO,
            )
    return times


def _use_delay(sb, delay_s: float, time_scale: float) -> dict:
    """Set the sandbox's visibility delay and clock, and save the GcpTarget block with the sampling period and delay
    the sandbox now reports (as a user's target carries Cloud Monitoring's)."""
    from blocks.target import GcpTarget

    sb.configure(monitoring_delay_seconds=delay_s, time_scale=time_scale)
    target = httpx.get(f"{sb.control_url}/_sandbox/info", timeout=30).json()["target"]
    GcpTarget.model_validate(target).save("sandbox", overwrite=True)
    return target


def measure(sb, case: int, delay_s: float, time_scale: float, samples: int, kind: str = "5xx") -> dict:
    """One promotion rolled back under traffic; the times, the bound and the client's failures."""
    from blocks.profile import ServingProfile
    from flows.common import load_target
    from flows.promote import promote_model
    from sandbox.traffic import Traffic
    from tasks.common import clients
    from tasks.deploy.probe import VerifyOptions

    target_json = _use_delay(sb, delay_s, time_scale)
    period, delay = target_json["metrics_sample_seconds"], target_json["metrics_delay_seconds"]
    target = load_target("sandbox")
    service = f"rollback-{case}"
    params = {"model": "sandbox/tiny-chat", "service": service, "token_secret_block": "sandbox-hf-token",
              "target": "sandbox", "verify": VerifyOptions(health_period_s=0.05)}  # fmt: skip
    stream = kind == "stream"
    if stream:
        ServingProfile.preset("l4", metrics="vllm").save(METRICS_PROFILE, overwrite=True)
        params["profile"] = METRICS_PROFILE
    old = promote_model(**params, watch={"samples": 0}).serving_revision
    url = clients.run_services(target).get_service(name=f"{target.location_path}/services/{service}").uri
    client = Traffic(url, clients.identity_token(target, url).get_secret_value(), stream=stream, max_tokens=16)
    thread = threading.Thread(target=client.run, daemon=True)
    thread.start()
    faults = STREAM_FAULT if stream else FAULT
    sb.run("POST", "/faults", json={"service": service, "faults": faults, "revisions": 1})
    state = promote_model(**params, revision="dev", watch={"samples": samples, **SLO}, return_state=True)
    failed_at = time.monotonic()
    time.sleep(AFTER_S)
    client.stop.set()
    thread.join(timeout=30)

    message = str(state.message or "")
    answers = sorted(client.answers, key=lambda a: a.started)
    bad = [a for a in answers if a.failed]
    candidate_answers = [a for a in answers if a.revision not in (old, "")]
    ok = state.is_failed() and "breached the SLO" in message
    row: dict = {
        "kind": kind, "delay_sim_s": delay_s, "time_scale": time_scale, "period_s": period, "delay_s": delay,
        "outcome": "rolled back" if ok else f"NOT rolled back: {state.type.value} {message[:200]}",
        "requests": len(answers), "failed": len(bad), "candidate_requests": len(candidate_answers),
        "failed_share": round(len(bad) / len(answers), 4) if answers else None,
    }  # fmt: skip
    if not bad or not candidate_answers:
        return row
    t_bad = bad[0].finished
    last_candidate = candidate_answers[-1].started
    back = [a for a in answers if a.revision == old and a.started > last_candidate]
    if not back:
        return row
    t_back = back[0].started
    # While the candidate served: from the first request it answered to traffic back (the fault's share: 1 in 3).
    serving = [a for a in answers if candidate_answers[0].started <= a.started < t_back]
    tasks = _task_times(state.state_details.flow_run_id)
    watch_end = tasks.get("monitoring_watch_revision", (None, None))[1]
    abandon = tasks.get("run_abandon_candidate")
    update = abandon[1] - abandon[0] if abandon else None
    promoted = tasks.get("run_promote_candidate", (None, None))[1]
    bound = 2 * period + delay + (update or 0.0)
    seconds = t_back - t_bad
    row.update({
        "time_to_rollback_s": round(seconds, 3),
        "time_to_rollback_periods": round(seconds / period, 2),
        "bound_s": round(bound, 3),
        "bound_periods": round(bound / period, 2),
        "within_bound": seconds <= bound,
        "first_bad_after_promote_s": round(t_bad - promoted, 3) if promoted else None,
        "detection_s": round(watch_end - t_bad, 3) if watch_end else None,
        "traffic_update_s": round(update, 3) if update is not None else None,
        "back_to_run_failed_s": round(failed_at - t_back, 3),
        "failed_while_candidate_share": round(len([a for a in serving if a.failed]) / len(serving), 4),
        "failed_after_back": len([a for a in bad if a.started >= t_back]),
        "old_answers_after_back": len(back),
    })  # fmt: skip
    return row


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--delays", default="0,60,180", help="visibility delays to try, simulated seconds")
    parser.add_argument("--kinds", default="5xx,stream", help="bad candidates: 5xx answers, stream errors")
    parser.add_argument("--time-scale", type=float, default=0.01, help="real seconds per simulated second")
    parser.add_argument("--samples", type=int, default=10, help="watch window in sampling periods")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    delays = [float(d) for d in args.delays.split(",") if d.strip()]
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    from prefect.testing.utilities import prefect_test_harness

    from sandbox.blocks import save_sandbox_blocks
    from sandbox.handle import SandboxHandle
    from sandbox.metadata import point_google_auth_at

    # The client's and the watch's ID tokens come from the sandbox's metadata server, as on a Cloud Run worker.
    metadata_port = point_google_auth_at()
    rows = []
    with (
        tempfile.TemporaryDirectory(prefix="bench-rollback-") as scratch,
        SandboxHandle.start(Path(scratch) / "sandbox", "--metadata-port", str(metadata_port)) as sb,
        prefect_test_harness(),
    ):
        os.environ["HF_ENDPOINT"] = sb.hub_url
        save_sandbox_blocks(Path(scratch) / "sandbox")
        kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
        for case, (kind, delay) in enumerate((k, d) for k in kinds for d in delays):
            rows.append(measure(sb, case, delay, args.time_scale, args.samples, kind))
    print(f"machine: {os.cpu_count()} cores, Python {sys.version.split()[0]}; watch of {args.samples} sampling "
          f"periods, SLO {SLO}\n")  # fmt: skip
    print(
        "| bad candidate | delay (sim s) | period s | delay s | outcome | time to rollback s | periods | bound s "
        "| bound periods | detection s | traffic update s | failed / requests | failed while candidate "
        "| failed after back |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        head = f"| {r['kind']} | {r['delay_sim_s']:.0f} | {r['period_s']:.2f} | {r['delay_s']:.2f} | {r['outcome']} |"
        failed = f"{r['failed']} / {r['requests']}"
        if "time_to_rollback_s" not in r:
            print(f"{head} - | - | - | - | - | - | {failed} | - | - |")
            continue
        print(
            f"{head} {r['time_to_rollback_s']:.2f} | {r['time_to_rollback_periods']:.1f} | {r['bound_s']:.2f} | "
            f"{r['bound_periods']:.1f} | {_num(r['detection_s'])} | {_num(r['traffic_update_s'])} | "
            f"{failed} ({100 * r['failed_share']:.1f} %) | {100 * r['failed_while_candidate_share']:.1f} % | "
            f"{r['failed_after_back']} |"
        )
    print()
    for r in rows:
        if "time_to_rollback_s" in r:
            print(
                f"{r['kind']}, delay {r['delay_sim_s']:.0f} s: rollback {r['time_to_rollback_periods']:.1f} sampling "
                f"periods after the first bad response; the bound is 1 + {r['delay_s'] / r['period_s']:.0f} + 1 "
                f"periods + the traffic update ({_num(r['traffic_update_s'])} s) = {r['bound_periods']:.1f} periods"
                f"{'' if r['within_bound'] else ' (OVER THE BOUND)'}"
            )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
