"""The promotion report as a user reads it: the key figures on the first screen, a refusal's fixes first."""

from __future__ import annotations

from blocks.profile import ServingProfile
from tasks.checks.findings import Finding, PreflightError
from tasks.image.builds import BuildAttempt, ImageBuildError, ImageResult
from tasks.report.cost import WatchPlan, estimate
from tasks.report.report import PromotionReport, Step
from tasks.weights.staging import StagingResult

LOG = "https://console.cloud.google.com/cloud-build/builds;region=europe-west4/{}?project=123"


def _report(**update) -> PromotionReport:
    report = PromotionReport(
        model="org/chat", revision="main", service="chat", project="proj", region="europe-west4", commit="a" * 40
    )
    return report.model_copy(update=update)


def _promoted() -> PromotionReport:
    return _report(
        outcome="promoted",
        serving_revision="chat-new",
        previous_revision="chat-old",
        service_url="https://chat.run.app",
        candidate_url="https://candidate---chat.run.app",
        traffic=[("chat-new", 100)],
        # deployments/gemma-4-e2b.yaml's delivery: canary [10, 50], 10 samples a step; the sidecar on; 55 h a week.
        cost=estimate(ServingProfile.preset("l4", metrics="vllm"), 55, WatchPlan(canary=[10, 50], samples=10)),
        staging=StagingResult(
            repo_id="org/chat",
            commit="a" * 40,
            uri="gs://b/models/org/chat/aaa",
            object_prefix="models/org/chat/aaa",
            files_uploaded=3,
            files_skipped=0,
            bytes_uploaded=4_000_000,
            bytes_skipped=0,
            total_bytes=4_000_000,
            seconds=2.0,
            mb_per_s=2.0,
            noop=False,
        ),
        image=ImageResult(
            image="repo/vllm@sha256:1",
            tag="t",
            strategy="build",
            reused=False,
            attempts=[
                BuildAttempt(
                    max_jobs=32, build_id="b1", status="INTERNAL_ERROR", log_url=LOG.format("b1"), seconds=3.0
                ),
                BuildAttempt(max_jobs=16, build_id="b2", status="SUCCESS", log_url=LOG.format("b2"), seconds=5.5),
            ],
        ),
        steps=[
            Step(name="preflight", seconds=0.12, ok=True),
            Step(name="stage", seconds=20.5, ok=True),
            Step(name="image", seconds=8.5, ok=True),
            Step(name="verify", seconds=3.0, ok=True),
        ],
    )


def _first_screen(text: str) -> str:
    """What shows before the details: the headline and the key-figures table."""
    assert "\n## Details\n" in text, text
    return text.split("\n## Details\n")[0]


def test_the_first_screen_has_outcome_revision_traffic_urls_cost_and_time():
    text = _promoted().markdown()
    assert text.startswith("# org/chat@main on chat: promoted\n")
    first = _first_screen(text)
    for row in (
        "| outcome | promoted |",
        "| serving revision | chat-new (previous: chat-old) |",
        "| traffic now | chat-new 100 % |",
        "| service URL | https://chat.run.app |",
        "| candidate URL | https://candidate---chat.run.app |",
        "| cost | $1.42/h per instance (L4 $0.67 + 8 vCPU $0.52 + 32 GiB $0.23); $78/week, $340/month at 55 warm "
        "h/week (its schedule) vs $1,038/month always on |",
        "| cost, also | weights <$0.001/month (0.00373 GiB in Cloud Storage, per staged commit); flow job $0.001 this "
        "run (Cloud Run job, 2 vCPU, 4 GiB, 32 s); second instance $0.92 per watched re-promotion (beside the "
        "candidate, 3 watched steps x 13 min); Managed Prometheus $0.74/month (430 series / 30 s); prices "
        "(us-central1) and their sources: tasks/report/prices.py |",
        "| time | 32.1 s in all, slowest stage 20.5 s: preflight 0.1 s · stage 20.5 s · image 8.5 s · verify 3.0 s |",
    ):
        assert f"\n{row}\n" in first, f"{row} is not on the first screen:\n{first}"
    # Detailed rows stay below: the first screen is short enough to read without scrolling.
    assert "| staged |" not in first and "| step | seconds | ok |" not in first
    assert len(first.splitlines()) <= 14, first


def test_the_second_instance_is_priced_only_where_a_serving_revision_ran_beside_the_candidate():
    assert "second instance" in _promoted().markdown()
    first_deploy = _promoted().model_copy(update={"previous_revision": None})
    unchanged = _promoted().model_copy(update={"outcome": "unchanged"})
    for report in (first_deploy, unchanged):
        assert "second instance" not in report.markdown()


def test_the_report_links_the_cloud_run_console_and_the_build_log():
    report = _promoted()
    assert report.console_url == (
        "https://console.cloud.google.com/run/detail/europe-west4/chat/revisions?project=proj"
    )
    assert report.build_log_url == LOG.format("b2")  # the build that made the image
    first = _first_screen(report.markdown())
    assert f"| console | [Cloud Run revisions]({report.console_url}) · [Cloud Build log]({LOG.format('b2')}) |" in first
    details = report.markdown().split("\n## Details\n")[1]
    assert (
        f"| build attempts | 1. max_jobs=32: INTERNAL_ERROR in 3.0 s ([log]({LOG.format('b1')})); "
        f"2. max_jobs=16: SUCCESS in 5.5 s ([log]({LOG.format('b2')})) |"
    ) in details


def test_a_prebuilt_image_has_no_build_log_and_a_dry_run_no_console_link():
    report = _report(
        outcome="dry-run", image=ImageResult(image="vllm/vllm-openai:v1", strategy="prebuilt", reused=True)
    )
    assert report.build_log_url is None
    assert "| console |" not in report.markdown()


def test_a_refusal_shows_the_reason_every_fix_and_where_traffic_stands_first():
    report = _report(
        traffic=[("chat-old", 100)],
        serving_revision=None,
        previous_revision=None,
        steps=[Step(name="preflight", seconds=0.05, ok=False)],
    )
    report.fail(
        PreflightError(
            [
                Finding(
                    severity="error", setting="max_instances", message="5 is above the quota; set max_instances to 3"
                ),
                Finding(severity="error", setting="concurrency", message="8 is too low; leave concurrency empty"),
                Finding(severity="warning", setting="load_rate_mb_s", message="slow load"),
            ]
        )
    )
    first = _first_screen(report.markdown())
    lines = first.splitlines()
    assert lines[0] == "# org/chat@main on chat: NOT promoted"
    reason = lines.index("**Reason:** preflight found 2 problems to fix first: max_instances, concurrency")
    fixes = [i for i, line in enumerate(lines) if line.startswith("- error: `")]
    traffic = lines.index("| traffic now | chat-old 100 % |")
    assert reason < fixes[0] and len(fixes) == 2 and fixes[-1] < traffic
    assert "set max_instances to 3" in lines[fixes[0]] and "leave concurrency empty" in lines[fixes[1]]
    assert "| outcome | NOT promoted: the preflight step failed |" in lines
    assert "| serving revision | chat-old (unchanged by this run) |" in lines
    assert "| time | preflight 0.1 s FAILED |" in lines
    assert "- warning: `load_rate_mb_s`: slow load" in report.markdown().split("\n## Details\n")[1]


def test_a_failed_build_keeps_its_attempts_and_links_the_last_log():
    attempts = [BuildAttempt(max_jobs=32, build_id="b9", status="FAILURE", log_url=LOG.format("b9"), seconds=1.0)]
    report = _report()
    report.fail(ImageBuildError("building repo/vllm:t ended FAILURE\nlog: ...", attempts))
    assert report.reason == "building repo/vllm:t ended FAILURE"
    assert report.build_log_url == LOG.format("b9")
    assert f"[Cloud Build log]({LOG.format('b9')})" in _first_screen(report.markdown())
    assert "| build attempts | 1. max_jobs=32: FAILURE in 1.0 s" in report.markdown()
