"""cold-start (issue 38) against the sandbox's stand-in: cold starts of the serving revision measured on a copy, phase
by phase from Cloud Run's and vLLM's log lines, production untouched and nothing left running; refused while another
run holds the service's lock, and on a new project whose quota cannot hold the copy beside production's instance."""

from __future__ import annotations

import itertools

import pytest
from google.api_core import exceptions as gexc

from blocks.profile import ServingProfile
from flows.cold_start import cold_start
from flows.common import service_lock
from flows.teardown import teardown
from sandbox.vllm.timing import (
    CUDA_GRAPH_CAPTURE_S,
    DECODE_TOKENS_PER_S,
    KV_CACHE_PROFILE_S,
    TORCH_COMPILE_CACHED_S,
    TORCH_COMPILE_S,
)
from tasks.common import clients
from tests.support.artifacts import artifact
from tests.support.promotion import promote, run_service

pytestmark = [pytest.mark.prefect]
_ids = itertools.count()


def traffic(flow_env, service: str) -> list[tuple[str, int, str]]:
    return [(s.revision, s.percent, s.tag) for s in run_service(flow_env, service).traffic_statuses]


def writes_to(sb, since: int, service: str) -> list[str]:
    """The Cloud Run Admin API writes to ``service`` itself (not its copy) since ``since``."""
    return [f"{r['method']} {r['path']}" for r in sb.requests("control", since=since)
            if r["method"] in ("POST", "PATCH", "DELETE") and f"/services/{service}" in r["path"]
            and f"/services/{service}-cold" not in r["path"]]  # fmt: skip


@pytest.mark.usefixtures("raised_quota")  # the copy's L4 instance beside production's: a new project's 40 GiB cannot
def test_cold_starts_are_measured_on_a_copy_phase_by_phase_and_production_is_untouched(sb, flow_env):
    service = f"cold-{next(_ids)}"
    # Not eager: the stand-in models vLLM's compile and CUDA graph capture on the L4, and says so in vLLM's words.
    ServingProfile.preset("l4", vllm={"enforce_eager": False}).save(f"{service}-compiled")
    promote(service, profile=f"{service}-compiled")
    before, since = traffic(flow_env, service), sb.last_request_seq()

    report = cold_start(service=service, target="sandbox", samples=2)

    assert [s.cold for s in report.samples] == [True, True], report
    for sample in report.samples:
        # vLLM's own figures are the stand-in's modelled seconds (sandbox/vllm/timing.py) ...
        assert sample.phases["compile"] == TORCH_COMPILE_S and sample.phases["graph_capture"] == CUDA_GRAPH_CAPTURE_S
        assert sample.phases["kv_cache_init"] == KV_CACHE_PROFILE_S, sample.phases
        assert sample.phases["weights_load"] > 0, sample.phases
        # ... and Cloud Run's lines bound the rest: the instance it started, the probe that passed.
        assert {"instance_start", "container_start", "startup_probe", "first_token"} <= set(sample.phases), sample
        # The same request's decode speed, by the engine's own clock (its /metrics): the L4's modelled rate.
        assert sample.decode_tokens_per_s == pytest.approx(DECODE_TOKENS_PER_S["nvidia-l4"], rel=0.01), sample
    assert report.samples[0].instance != report.samples[1].instance, "each sample is a new instance"
    assert report.recommendation.startswith("compile takes 210.0 s"), report.recommendation
    assert traffic(flow_env, service) == before and writes_to(sb, since, service) == []
    with pytest.raises(gexc.NotFound):
        run_service(flow_env, f"{service}-cold")  # deleted, and nothing of it runs
    assert not [i for i in sb.run("GET", "/instances") if f"/services/{service}-cold/" in i["revision"]]
    text = artifact(f"cold-start-{service}")
    assert "| #1 |" in text and "| #2 |" in text and "**Recommendation:** compile takes" in text, text
    assert "| decode tok/s |" in text and "turn on the profile's compile_cache" in text, text


@pytest.mark.usefixtures("raised_quota")  # as above: the copy's L4 beside production's exceeds a new project's 40 GiB
def test_a_kept_compile_cache_is_restored_by_every_later_start_and_goes_with_the_service(sb, flow_env):
    service = f"cold-cache-{next(_ids)}"
    ServingProfile.preset("l4", compile_cache=True, vllm={"enforce_eager": False}).save(f"{service}-cached")
    promote(service, profile=f"{service}-cached")  # its first start compiled, and saved the cache to the bucket
    bucket = flow_env.bucket_name
    storage = clients.storage(flow_env)

    report = cold_start(service=service, target="sandbox", samples=2)

    assert report.compile_cache and report.compile_cache.startswith(f"gs://{bucket}/compile-cache/sandbox/tiny-chat/")
    folder = report.compile_cache.removeprefix(f"gs://{bucket}/")
    saved = [b.name for b in storage.list_blobs(bucket, prefix=f"{folder}/")]
    assert any(name.endswith("/rank_0_0/model") for name in saved), saved
    for sample in report.samples:  # the copy mounts the same folder: each start restores instead of compiling
        assert sample.phases["compile"] == pytest.approx(TORCH_COMPILE_CACHED_S, abs=0.01), sample.phases  # printed .2f
        assert sample.phases["graph_capture"] == CUDA_GRAPH_CAPTURE_S, "CUDA graphs are captured at each start"
    assert report.recommendation.startswith("graph_capture takes"), report.recommendation  # compile no longer leads
    assert f"Compile cache: `{report.compile_cache}`" in artifact(f"cold-start-{service}")

    results = teardown(service=service, target="sandbox", staged_weights=True)
    bucket_result = next(r for r in results if r.kind == "bucket")
    assert f"deleted gs://{bucket}/{folder} ({len(saved)} objects)" in bucket_result.changes, bucket_result
    assert not list(storage.list_blobs(bucket, prefix=f"{folder}/")), "the service's cache goes with its weights"


def test_a_new_projects_quota_refuses_the_copy_and_nothing_is_left(sb, flow_env):
    service = f"cold-quota-{next(_ids)}"
    promote(service)  # its L4 instance (8 vCPU, 32 GiB) runs: a second one exceeds a new project's 40 GiB
    with pytest.raises(Exception, match=rf"the copy {service}-cold of \S+ did not start: .*Quota exceeded for total "
                                        rf"allowable memory.* scale {service} to zero first"):  # fmt: skip
        cold_start(service=service, target="sandbox", samples=1)
    with pytest.raises(gexc.NotFound):
        run_service(flow_env, f"{service}-cold")


def test_it_refuses_to_run_while_another_run_holds_the_services_lock(sb, flow_env):
    service = f"cold-locked-{next(_ids)}"
    promote(service)
    since = sb.last_request_seq()
    with service_lock(flow_env, service), pytest.raises(RuntimeError, match=f"service {service}: another run"):
        cold_start(service=service, target="sandbox", samples=1)
    assert not [r for r in sb.requests("control", since=since) if r["method"] != "GET"], "refused before any write"
