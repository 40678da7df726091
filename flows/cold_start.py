"""cold-start: where a service's cold starts spend their seconds, measured on the user's own project.

Scale-to-zero is why people serve on Cloud Run, and the cold start is its price; GPU figures can only come from the
user's project. The flow copies the serving revision into a service of its own (tasks/watch/coldstart/copy.py: forcing a
cold start stops every instance, which production must never see), starts it from zero ``samples`` times, each a
streamed request timed to its first token, and reads each start's phases from Cloud Run's and vLLM's own log lines
(tasks/watch/coldstart/phases.py). The copy is deleted at the end, whatever happened.

    prefect deployment run cold-start/measure -p service=gemma-4-e2b -p samples=3
    python -m flows.cold_start gemma-4-e2b --samples 3 --target production
"""

from __future__ import annotations

import argparse

import httpx
from google.cloud import run_v2
from prefect import flow, task
from prefect.artifacts import create_markdown_artifact
from pydantic import SecretStr

from blocks.target import GcpTarget
from flows.common import DEFAULT_TARGET, load_target, service_lock
from flows.service_lock import ServiceLockTimeout
from tasks.common import clients
from tasks.common.logs import run_logger
from tasks.infra.shared_use import cache_folders
from tasks.watch.coldstart.copy import copy_id, create_copy, delete_copy
from tasks.watch.coldstart.instance_logs import cold_start_marks
from tasks.watch.coldstart.phases import phases
from tasks.watch.coldstart.report import ColdStartReport, Sample, markdown, recommend
from tasks.watch.coldstart.sample import restart_from_zero, timed_request

LOCK_WAIT_S = 10  # a promotion holds the lock for many minutes: say so rather than wait behind it
REQUEST_DEADLINE_S = 900.0  # a GPU start with compile and graph capture takes minutes (seed 000: over 5)
run_create_copy = task(name="copy the serving revision")(create_copy)
run_delete_copy = task(name="delete the copy")(delete_copy)


def served_name(url: str, token: SecretStr) -> str:
    """The model name the copy serves (its first instance, started by the deploy, answers)."""
    headers = {"Authorization": f"Bearer {token.get_secret_value()}"}
    response = httpx.get(f"{url}/v1/models", headers=headers, timeout=REQUEST_DEADLINE_S)
    response.raise_for_status()
    return response.json()["data"][0]["id"]


@task(name="cold start", task_run_name="cold start #{number}")
def measure(
    target: GcpTarget, copy: str, revision: str, url: str, token: SecretStr, model: str, prompt: str, number: int
) -> Sample:
    """One cold start: the copy stopped and back from zero, a streamed request timed, its logs read into phases."""
    restart_from_zero(target, copy)
    timed = timed_request(url, token, model, prompt, REQUEST_DEADLINE_S)
    found = cold_start_marks(target, copy, revision, timed.sent, timed.first_token)
    if found is None:
        run_logger().warning("sample #%d found an instance running: not a cold start, not counted", number)
        return Sample(number=number, ttft_s=timed.ttft_s, cold=False, refused_for_s=timed.refused_for_s,
                      decode_tokens_per_s=timed.decode_tokens_per_s)  # fmt: skip
    instance, marks = found
    sample = Sample(number=number, ttft_s=timed.ttft_s, phases=phases(timed.sent, timed.first_token, marks),
                    instance=instance[:12], refused_for_s=timed.refused_for_s,
                    decode_tokens_per_s=timed.decode_tokens_per_s,
                    weights_gib=marks.weights_gib)  # fmt: skip
    said = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in sample.phases.items())
    decode = f"; then {sample.decode_tokens_per_s:.1f} tokens/s" if sample.decode_tokens_per_s else ""
    run_logger().info("cold start #%d: first token after %.1f s (%s)%s", number, sample.ttft_s, said, decode)
    return sample


@flow(name="cold-start", log_prints=True)
def cold_start(
    service: str, target: str = DEFAULT_TARGET, samples: int = 3, prompt: str = "Say hello in one word."
) -> ColdStartReport:
    """Measure ``samples`` cold starts of the service's serving revision, on a copy, and say where the time goes.

    Production is never written to: the serving revision's exact configuration is copied into `<service>-cold`
    (no minimum, one instance at most, the same invokers), which is stopped and started from zero for each sample
    and deleted at the end. The copy needs one instance's worth of the region's quota (a GPU) beside production.
    The run refuses to start while another run (a promotion) holds the service's lock, and holds it while it runs.

    Each sample runs from a streamed request to its first token; its phases come from Cloud Run's lines (instance
    started, startup probe passed) and vLLM's (weights loaded, compile, CUDA graphs, engine ready, API server up).
    The artifact `cold-start-<service>` has a table and a chart of the phases per sample and what to try first.

    Args:
        service: The Cloud Run service whose serving revision is measured, e.g. gemma-4-e2b.
        target: The GcpTarget block that names the project and region (bootstrap saves `production`).
        samples: Cold starts to measure (1 to 10); each starts an instance and, on a GPU service, holds a GPU.
        prompt: The chat message each sample sends (its first token ends the sample).
    """
    if not 1 <= samples <= 10:
        raise ValueError(f"samples: {samples}; measure 1 to 10 cold starts (each holds an instance while it runs)")
    gcp = load_target(target)
    try:
        with service_lock(gcp, service, timeout_s=LOCK_WAIT_S):  # no promotion changes what is measured meanwhile
            report = _measure(gcp, service, samples, prompt)
    except ServiceLockTimeout:  # only taking the lock raises it: the copy is not fenced, production is never written
        raise RuntimeError(f"service {service}: another run (a promotion, a scale or a rollback) holds its lock; "
                           "run cold-start when it has finished") from None  # fmt: skip
    create_markdown_artifact(key=f"cold-start-{service}", markdown=markdown(report),
                             description=f"cold starts of {service}")  # fmt: skip
    print(f"cold-start {service}: {len(report.cold)} cold start(s); {report.recommendation}")
    return report


def _measure(gcp: GcpTarget, service: str, samples: int, prompt: str) -> ColdStartReport:
    copy_name = copy_id(service)
    try:
        copy, revision = run_create_copy(gcp, service)
        token = clients.identity_token(gcp, copy.uri)
        model = served_name(copy.uri, token)
        copied = copy.latest_ready_revision.rsplit("/", 1)[-1]
        measured = [measure(gcp, copy_name, copied, copy.uri, token, model, prompt, n) for n in range(1, samples + 1)]
    finally:
        run_delete_copy(gcp, service)
    cold = [sample for sample in measured if sample.cold]
    cache = cache_folder(copy)
    return ColdStartReport(service=service, revision=revision, copy_service=copy_name, copy_revision=copied,
                           samples=measured, compile_cache=cache,
                           recommendation=recommend(cold, cache) if cold else "no sample was a cold start")  # fmt: skip


def cache_folder(service: run_v2.Service) -> str | None:
    """gs://BUCKET/FOLDER of the copy's compile cache volume, when the profile keeps one."""
    return next((f"gs://{bucket}/{folder}" for bucket, folder in sorted(cache_folders(service.template))), None)


def main(argv: list[str] | None = None) -> None:
    """The CLI: the same flow, run here (its run shows in the Prefect UI like a deployment's)."""
    parser = argparse.ArgumentParser(prog="python -m flows.cold_start", description=cold_start.__doc__.split("\n")[0])
    parser.add_argument("service")
    parser.add_argument("--samples", type=int, default=3)
    parser.add_argument("--target", default=DEFAULT_TARGET)
    parser.add_argument("--prompt", default="Say hello in one word.")
    args = parser.parse_args(argv)
    cold_start(service=args.service, target=args.target, samples=args.samples, prompt=args.prompt)


if __name__ == "__main__":
    main()
