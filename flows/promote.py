"""promote-model: a Hugging Face model to a verified vLLM revision on Cloud Run, or a report saying why not.

preflight -> resolve -> check service -> ensure infra -> stage weights -> image -> render -> deploy candidate ->
verify -> deliver (flows/delivery.py: canary steps, promote, watch; flows/replace.py for the replace rollout) ->
report. Traffic moves only after the candidate has answered a real chat completion at its own URL; on any failure
it stays where it was, and the report says so.
"""

from __future__ import annotations

import httpx
from google.api_core import exceptions as gexc
from google.cloud import run_v2
from prefect import flow, task
from prefect.artifacts import create_link_artifact, create_markdown_artifact

from blocks.images import ImageBuild
from blocks.profile import ServingProfile
from blocks.source import ModelSource
from blocks.target import GcpTarget
from flows.common import DEFAULT_TARGET, emit, load_profile, load_target, read_spec, service_lock, validated
from flows.delivery import Delivery, DeliveryRun, deliver, watch_promoted
from flows.doctor import check_project
from flows.gate import abandoned_on_failure, judge_answers, quality_payload, quality_set
from flows.preflight import check_rollout, preflight, room_for_candidate
from flows.replace import Stopped, deliver_in_place, resume_after_failed_replace, stop_for_replace
from flows.service_lock import ServiceLock
from tasks.checks import act_as
from tasks.checks.preflight import (
    ModelFacts,
    check_model,
    check_service,
    raise_on_errors,
)
from tasks.common import clients
from tasks.common.gcp import explain_forbidden
from tasks.common.logs import run_logger
from tasks.common.naming import CANDIDATE_TAG
from tasks.common.progress import artifact_key
from tasks.deploy.cloudrun import (
    Candidate,
    run_check_candidate_verdict,
    run_deploy_candidate,
    run_verify_candidate,
    service_id_for,
    service_path,
)
from tasks.deploy.probe import VerifyOptions
from tasks.deploy.render import Weights, gcloud_command, render_service, revision_name, service_yaml
from tasks.image.builds import cloudbuild_run_build, resolve_image, source_digest
from tasks.image.images import build_plan, content_tag, render_build, render_build_yaml
from tasks.infra import access, build_identity, ensure
from tasks.quality.spec import QualitySet, QualitySpec
from tasks.report.archive import gcs_archive_report
from tasks.report.cost import CostEstimate, WatchPlan, estimate
from tasks.report.report import PromotionReport
from tasks.report.schedules import WarmHours
from tasks.watch.canary import (
    WatchOptions,
    check_canary,
    monitoring_read_revision,
)
from tasks.weights.hub_download import read_json_file
from tasks.weights.hub_listing import resolve_model
from tasks.weights.selection import check_index, index_to_check, select_files
from tasks.weights.staging import StagingOptions, StagingResult, commit_prefix, hf_stage_model

SAFETENSORS = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
BUCKET_READY = "infrastructure"  # the step that ensures the bucket (the first to write: earlier ones only read)


@task(name="hf_resolve_model")
def hf_resolve_model(
    source: ModelSource, token_secret_block: str | None, options: StagingOptions
) -> tuple[str, int, dict | None]:
    """Resolve the revision to a commit; the selected weights' size and the model's config.json."""
    access_ = clients.hub(source, clients.hub_token(source, token_secret_block))
    resolved = resolve_model(access_, source, options.retry)
    selected = select_files(resolved.files, source.allow_patterns, source.ignore_patterns, source.repo_id,
                            resolved.commit)  # fmt: skip
    weights = sum(f.size for f in selected if f.path.endswith(SAFETENSORS))
    config_file = next((f for f in selected if f.path == "config.json"), None)
    config = None
    with httpx.Client(timeout=60) as http:  # sizes bounded before a JSON file is read whole (read_json_file)
        if config_file is not None:
            config = read_json_file(http, access_, source.repo_id, resolved.commit, config_file, options.retry)
        index = index_to_check(selected)
        if index is not None:  # an index naming absent shards fails here, before any cloud write
            index_json = read_json_file(http, access_, source.repo_id, resolved.commit, index, options.retry)
            check_index(index_json, selected, resolved.files, source.repo_id)
    return resolved.commit, weights, config


def ensure_infrastructure(target: GcpTarget, profile: ServingProfile, source: ModelSource) -> list[str]:
    """Bucket, registry, build bucket and the build identity with its grants (when building), network and subnet,
    service account and its read access to the bucket;
    with hf_token_at_runtime, the Hub token in Secret Manager and the service account's access to it alone.

    Each resource is its own task run, so the run graph shows which one failed; they run one after the other in
    this order (a grant needs its account and bucket). Returns one line per resource: what was done to it."""
    steps = [ensure.gcs_ensure_bucket, ensure.compute_ensure_network, ensure.compute_ensure_subnet,
             ensure.iam_ensure_service_account]  # fmt: skip
    if profile.build is not None:  # builds only: none otherwise
        steps[1:1] = [ensure.artifactregistry_ensure_repository, ensure.gcs_ensure_build_bucket]
    results = [step(target) for step in steps]
    # Deploying as the serving account needs actAs on it: say so now, before any weights are staged.
    act_as.iam_check_act_as(target, target.service_account_email, "deploying as the serving account")
    results.append(access.gcs_grant_object_viewer(target, profile.compile_cache))
    if profile.metrics == "vllm":  # the Prometheus sidecar writes vLLM's metrics as the serving account
        results.append(access.resourcemanager_grant_metric_writer(target))
    if profile.build is not None:  # builds run as their own least-privilege identity (tasks/infra/build_identity.py)
        results += [step(target) for step in build_identity.BUILD_IDENTITY_TASKS]
        act_as.iam_check_act_as(target, target.build_service_account_email, "building as the build identity")
    if profile.hf_token_at_runtime:
        # The token is read inside its task from the source's Secret block (or HF_TOKEN): never a parameter,
        # so it never shows among the run's parameters in the UI, and never logged. Preflight made sure it exists.
        results += [ensure.secretmanager_ensure_hf_token(target, source), access.secretmanager_grant_accessor(target)]
    return [f"{r.kind} {r.name}: {r.action}" + (f" ({'; '.join(r.changes)})" if r.changes else "") for r in results]


def _planned_image(target: GcpTarget, profile: ServingProfile, exact_tag: bool) -> tuple[str, str | None]:
    """The image the service will run, and the Cloud Build YAML when it is built, without any cloud call.

    The content tag of a local source is computed only for the plan a dry run shows (hashing the tree is the
    build step's work); a git source is not resolved before the build (no network calls). Otherwise the tag
    is a placeholder: no check on the service depends on it."""
    if profile.build is None:
        return profile.image or "", None
    build: ImageBuild = profile.build
    local = build.source_dir or build.recipe == "serve-wrapper"
    tag = content_tag(build, source_digest(build)) if local and exact_tag else "CONTENT-TAG"
    plan = build_plan(target, build, tag)
    return plan.tagged, render_build_yaml(render_build(target, build, plan, build.ladder[0]))


def _planned_service(
    target: GcpTarget, profile: ServingProfile, source: ModelSource, service_id: str, weights: Weights,
    exact_tag: bool,
) -> tuple[run_v2.Service, str | None]:  # fmt: skip
    """The service as it will be sent (the image by tag, not yet by digest), and the Cloud Build YAML if any."""
    image, build_yaml = _planned_image(target, profile, exact_tag)
    spec = render_service(profile, target, source, weights, image, revision_name(service_id, weights, image, profile))
    return spec, build_yaml


def _dry_run_plan(report: PromotionReport, target: GcpTarget, spec: run_v2.Service, build_yaml: str | None) -> str:
    """The plan as markdown: what would be deployed, the gcloud equivalent, and the Cloud Build YAML."""
    service_id = report.service
    parts = [
        report.markdown(),
        "## gcloud equivalent\n",
        f"```bash\n{gcloud_command(service_id, target, spec)}\n```\n",
        "## Service YAML (gcloud run services replace)\n",
        f"```yaml\n{service_yaml(service_id, target, spec)}```\n",
    ]
    if build_yaml:
        parts += ["## Cloud Build config (gcloud builds submit --config)\n", f"```yaml\n{build_yaml}```\n"]
    return "\n".join(parts)


@flow(name="promote-model", log_prints=True)
def promote_model(
    model: str | None = None,
    revision: str | None = None,
    profile: str | None = None,
    target: str | None = None,
    service: str | None = None,
    image: str | None = None,
    build: ImageBuild | None = None,
    load_mode: str | None = None,
    token_secret_block: str | None = None,
    hub_endpoint: str | None = None,
    allow_patterns: list[str] | None = None,
    ignore_patterns: list[str] | None = None,
    verify: VerifyOptions | None = None,
    canary: list[int] | None = None,
    watch: WatchOptions | None = None,
    rollout: str | None = None,
    dry_run: bool = False,
    warm_hours_per_week: float | None = None,
    spec_file: str | None = None,
    force: bool = False,
    quality: QualitySpec | None = None,
) -> PromotionReport:
    """Promote a Hugging Face model to a healthy vLLM revision on Cloud Run GPUs.

    Preflight, resolve the revision, ensure the infrastructure, stage the weights in the target's bucket, pin or build
    the image, deploy a `candidate` revision with no traffic and verify it (health, models, a chat completion); then
    move traffic in the `canary` steps and to 100 %, each step watched. A breach moves traffic back to the revision
    that served before, emits `model.rolled_back` and fails the run; any other failure leaves traffic where it was.
    The report (an artifact) says what was done, what the service costs, and where traffic stands.

    Args:
        model: The Hub repo id to serve, e.g. google/gemma-4-E2B-it; empty to take the spec_file's.
        revision: The Hub branch, tag or commit; weights are staged per resolved commit (default main).
        profile: A preset (l4, rtx-pro-6000, cpu; default l4) or a saved ServingProfile block: GPU, resources, flags.
        target: The GcpTarget block that names the project and region (default production, which bootstrap saves).
        service: The Cloud Run service to deploy to; default a name made from the model id.
        image: A pinned prebuilt vLLM image to serve with, instead of the profile's image strategy.
        build: How to build the image with Cloud Build (a recipe, a git URL at a ref, or a local folder; the OOM
            ladder), instead of the profile's image strategy.
        load_mode: How weights reach vLLM: gcs-volume (a Cloud Storage volume mount) or runai-streamer (streamed
            from gs://); default the profile's.
        token_secret_block: The Secret block with the Hub token, for gated models like Gemma (bootstrap saves hf-token).
        hub_endpoint: Another Hub endpoint (a mirror); default huggingface.co.
        allow_patterns: Globs of the repo's files to stage (e.g. ["*.safetensors", "*.json"]), replacing the default
            selection: safetensors weights, config, tokenizer and chat-template files.
        ignore_patterns: Globs of the repo's files not to stage, taken out of either selection.
        verify: What the candidate must show before it takes traffic: health window and cadence, the chat prompt,
            an optional load test and its SLO.
        canary: Traffic steps in percent before 100, e.g. [10, 50]; each step is watched. Empty moves all at once.
        watch: How each traffic step is watched on Cloud Monitoring: sampling periods (the profile's watch_samples
            when empty, 0 turns the watch off) and the SLO a breach of which rolls traffic back (error ratio, request
            p95; with metrics: vllm also TTFT, TPOT and errors inside streams). A first deploy is not watched, nor a
            service too quiet to judge (the profile's watch_without_traffic); the report says which.
        rollout: zero-downtime (the candidate starts beside the serving revision) or replace (the serving revision
            stops first, for a GPU quota that cannot hold both; the report gives the downtime).
        dry_run: Change nothing: stop after preflight and rendering, and show the plan, gcloud command and build YAML.
        warm_hours_per_week: The warm hours a week the report's cost assumes; default the model file's schedule
            (55 h: 08:00-19:00 Mon-Fri), or with no model file, as min_instances runs the service.
        spec_file: A model file in deployments/, e.g. deployments/gemma-4-e2b.yaml, supplying each parameter not given.
        force: Deploy and verify again a candidate a verdict found bad (it failed verification or the quality gate,
            or was rolled back: the same weights, image and profile), which is refused otherwise.
        quality: Prompts with expected answers judged before traffic moves (docs/quality-gate.md); default the file's.
    """
    spec = read_spec(spec_file)
    report, gcp = _new_report(spec, model, revision, target, service)
    try:  # from here on a failure has a service to report on: the report and the failure event go out with it
        serving = _serving_profile(spec, profile, image, build, load_mode)
        report.cost = _cost(serving, spec, warm_hours_per_week, from_model_file=spec_file is not None)
        source = _model_source(report, spec, allow_patterns, ignore_patterns, token_secret_block, hub_endpoint)
        delivery = _delivery(spec, serving, source, canary, watch, rollout, quality_set(spec, quality, spec_file))
        report.cost.watch = WatchPlan.of(delivery.canary, delivery.samples(serving), gcp, delivery.rollout)
        _promote(report, gcp, serving, source, verify, delivery, dry_run, force)
    except Exception as exc:
        _failed(report, gcp, exc)
        raise
    _publish(report, gcp, report.service)
    return report


def _failed(report: PromotionReport, gcp: GcpTarget, exc: Exception) -> None:
    """The report of a run that failed, published with where traffic stands."""
    report.fail(exc)  # a preflight refusal keeps all its findings, each with its fix
    _where_traffic_stands(report, gcp, report.service)
    _publish(report, gcp, report.service)


def _new_report(
    spec: dict, model: str | None, revision: str | None, target: str | None, service: str | None
) -> tuple[PromotionReport, GcpTarget]:
    """The report on the model, revision and service (the run's parameters over the model file's), and the target."""
    model = model or spec.get("model")
    if not model:
        raise ValueError("model: give a Hub repo id (e.g. google/gemma-4-E2B-it) or a spec_file with one")
    gcp = load_target(target or spec.get("target", DEFAULT_TARGET))
    report = PromotionReport(
        model=model, revision=revision or spec.get("revision", "main"),
        service=service or spec.get("service") or service_id_for(model), project=gcp.project, region=gcp.region,
    )  # fmt: skip
    return report, gcp


def _serving_profile(
    spec: dict, profile: str | None, image: str | None, build: ImageBuild | None, load_mode: str | None
) -> ServingProfile:
    """The profile the run serves with: the run's parameters over the model file's."""
    # The image strategy given to the run replaces the spec file's as a whole: a pinned image, or a build.
    image, build = (image, build) if image or build else (spec.get("image"), spec.get("build"))
    serving = load_profile(profile or spec.get("profile", "l4"), image, load_mode or spec.get("load_mode"), build)
    if spec.get("metrics") is not None:  # the model file's choice of the metrics sidecar, over the profile's
        serving = validated(ServingProfile, {**serving.model_dump(), "metrics": spec["metrics"]})
    return serving


def _cost(
    serving: ServingProfile, spec: dict, warm_hours_per_week: float | None, from_model_file: bool
) -> CostEstimate:
    """The report's cost estimate, under the schedule the model file gives its scale-service deployment (defaults:
    08-19 Mon-Fri) unless the run gives its warm hours."""
    warm_hours = (
        validated(WarmHours, spec.get("schedule") or {}).hours_per_week
        if warm_hours_per_week is None
        else float(warm_hours_per_week)
    )
    if not 0 <= warm_hours <= 168:
        raise ValueError(f"warm_hours_per_week: {warm_hours} is not between 0 and 168 (the hours of a week)")
    # A model file's service runs on the schedule sync_deployments gives it; a service promoted by parameters
    # alone has none, and runs as its min_instances says.
    scheduled = from_model_file or warm_hours_per_week is not None
    return estimate(serving, warm_hours if scheduled else None)


def _model_source(
    report: PromotionReport, spec: dict, allow_patterns: list[str] | None, ignore_patterns: list[str] | None,
    token_secret_block: str | None, hub_endpoint: str | None,
) -> ModelSource:  # fmt: skip
    """The repo and revision the report names, with what to stage of it and where from."""
    return validated(ModelSource, {
        "repo_id": report.model,
        "revision": report.revision,
        "allow_patterns": allow_patterns or spec.get("allow_patterns"),
        "ignore_patterns": ignore_patterns or spec.get("ignore_patterns"),
        "token_secret_block": token_secret_block or spec.get("token_secret_block"),
        "hub_endpoint": hub_endpoint or spec.get("hub_endpoint"),
    })  # fmt: skip


def _delivery(
    spec: dict, serving: ServingProfile, source: ModelSource, canary: list[int] | None, watch: WatchOptions | None,
    rollout: str | None, quality: QualitySet | None = None,
) -> Delivery:  # fmt: skip
    """How traffic is to move once the candidate is verified (and the quality set it must answer first): the run's
    parameters over the model file's."""
    delivery = Delivery(
        canary=check_canary(canary if canary is not None else spec.get("canary")),
        watch=validated(WatchOptions, watch if watch is not None else spec.get("watch") or {}, "watch"),
        vllm_metrics=serving.metrics == "vllm",
        rollout=check_rollout(rollout or spec.get("rollout") or "zero-downtime"),
        without_traffic=serving.watch_without_traffic,
        served_name=source.served_model_name,
        quality=quality,
    )
    delivery.watch.refuse_without_vllm_metrics(serving.metrics)
    return delivery


def _promote(
    report: PromotionReport, target: GcpTarget, profile: ServingProfile, source: ModelSource,
    verify: VerifyOptions | None, delivery: Delivery, dry_run: bool, force: bool = False,
) -> None:  # fmt: skip
    """The pipeline, each step timed in the report: checks that need no cloud write, then under the service's lock the
    infrastructure, the weights, the image, the candidate and its verification, and the traffic."""
    service_id = report.service
    if target.doctor_before_promote:
        with report.step("doctor"):
            # Read-only project checks first: a disabled API or a missing role fails here, before anything is spent.
            check_project(target, profile, service_id)
    with report.step("preflight"):
        needs = preflight(report, target, profile, source, delivery, dry_run, verify)
    with report.step("resolve"):
        weights = _resolve_revision(report, target, profile, source)
    with report.step("check service"):
        # The service as it will be sent, checked before any cloud call (only the image digest is still unknown).
        planned, build_yaml = _planned_service(target, profile, source, service_id, weights, exact_tag=dry_run)
        report.findings += raise_on_errors(check_service(profile, planned))
    if dry_run:
        _show_dry_run(report, target, source, planned, build_yaml)
        return
    with service_lock(target, service_id) as lock:
        with report.step("room"):  # under the lock, so that a promotion of the service just before it counts
            labels = dict(planned.template.labels)
            room = room_for_candidate(report, target, profile, delivery, needs, labels)
        with report.step("infrastructure"):
            for line in ensure_infrastructure(target, profile, source):
                run_logger().info(line)
        with report.step("stage"):
            report.staging = staged = hf_stage_model(target, source, source.token_secret_block, StagingOptions())
        with report.step("image"):
            report.image = image = resolve_image(target, profile, attempt=cloudbuild_run_build)
        with report.step("render"):
            spec = _render(report, target, profile, source, staged, image.image)
            if room.deferred:  # the same weights: a new image or new flags make a candidate that needs room too
                room_for_candidate(report, target, profile, delivery, needs, labels, spec.template.revision)
        with report.step("deploy candidate"):
            candidate, stopped = _deploy_candidate(report, target, profile, spec, delivery, lock, force)
        run = DeliveryRun(target, service_id, candidate, delivery, delivery.samples(profile), lock)
        if candidate.unchanged:
            _already_serving(report, run)
        else:
            with abandoned_on_failure(report, run, stopped, profile):
                with report.step("verify"):
                    _verify(report, run, source, verify)
                if delivery.quality is not None:
                    with report.step("quality gate"):
                        judge_answers(report, run, source, verify, stopped)
            if stopped is not None:
                deliver_in_place(report, run, stopped, profile)
            else:
                deliver(report, run)
        with report.step("invokers"):
            access.run_ensure_invokers(target, service_id)
        _where_traffic_stands(report, target, service_id)


def _resolve_revision(
    report: PromotionReport, target: GcpTarget, profile: ServingProfile, source: ModelSource
) -> Weights:
    """The revision as a commit, the model checked against the profile (its size, its config), and the weights as
    they will be staged."""
    commit, weights_bytes, config = hf_resolve_model(source, source.token_secret_block, StagingOptions())
    report.commit = commit
    report.findings += raise_on_errors(check_model(profile, ModelFacts(weights_bytes, config)))
    return Weights(source.repo_id, commit, target.bucket_name, commit_prefix(target, source.repo_id, commit),
                   weights_bytes)  # fmt: skip


def _show_dry_run(
    report: PromotionReport, target: GcpTarget, source: ModelSource, planned: run_v2.Service, build_yaml: str | None
) -> None:
    """The plan, printed and as an artifact; the run ends here, having changed nothing."""
    report.outcome = "dry-run"
    plan = _dry_run_plan(report, target, planned, build_yaml)
    create_markdown_artifact(plan, key=artifact_key(f"plan-{report.service}"),
                             description=f"dry run of {source.repo_id}")  # fmt: skip
    print(plan)


def _render(
    report: PromotionReport, target: GcpTarget, profile: ServingProfile, source: ModelSource, staged: StagingResult,
    image: str,
) -> run_v2.Service:  # fmt: skip
    """The service as it will be sent, on the staged weights and the image by digest: checked again, now whole."""
    weights = Weights(staged.repo_id, staged.commit, target.bucket_name, staged.object_prefix, staged.total_bytes)
    spec = render_service(
        profile, target, source, weights, image, revision_name(report.service, weights, image, profile)
    )
    final = raise_on_errors(check_service(profile, spec))
    report.findings += [f for f in final if f not in report.findings]
    return spec


def _deploy_candidate(
    report: PromotionReport, target: GcpTarget, profile: ServingProfile, spec: run_v2.Service, delivery: Delivery,
    lock: ServiceLock, force: bool,
) -> tuple[Candidate, Stopped | None]:  # fmt: skip
    """The candidate revision, deployed with no traffic (with the replace rollout, once the serving revision has
    stopped: returned too, to resume or replace); the report gets its URLs."""
    service_id = report.service
    lock.fence()  # the deploy reads the service afresh: only the lease needs to be good
    if overridden := run_check_candidate_verdict(target, service_id, spec.template.revision, force):
        run_logger().warning("%s", overridden)
        report.notes.append(overridden)
    stopped = stop_for_replace(target, service_id, spec, delivery)
    try:
        candidate = run_deploy_candidate(
            target, service_id, spec, gpu_freed=stopped is not None, before_retry=lock.fence
        )
    except Exception:
        if stopped is not None:
            resume_after_failed_replace(report, target, service_id, stopped, profile, lock)
        raise
    report.candidate_url = candidate.url if not candidate.unchanged else None
    report.service_url = candidate.service_url
    report.previous_revision = candidate.previous_revision
    report.candidate_revision = candidate.revision
    return candidate, stopped


def _already_serving(report: PromotionReport, run: DeliveryRun) -> None:
    """The revision serves all traffic already: nothing moves, unless the run that promoted it died during its watch;
    this run then finishes that promotion's watch."""
    report.outcome = "unchanged"
    report.serving_revision = run.candidate.revision
    if run.candidate.watch_pending:
        report.outcome = "promoted"
        watch_promoted(report, run, previous_url=run.candidate.previous_url)


def _verify(report: PromotionReport, run: DeliveryRun, source: ModelSource, verify: VerifyOptions | None) -> None:
    """The candidate answers at its own URL, and the watch can read its metrics (abandoned_on_failure abandons it
    otherwise, before any traffic moves)."""
    candidate = run.candidate
    report.verification = run_verify_candidate(run.target, candidate, source.served_model_name, verify)
    # A watch that cannot read the metrics must fail before traffic moves, not after (a first deploy is not
    # watched: flows/delivery.watch_plan).
    if run.samples and candidate.previous_traffic:
        monitoring_read_revision(run.target, run.service_id, candidate.revision, run.delivery.vllm_metrics)


def _where_traffic_stands(report: PromotionReport, target: GcpTarget, service_id: str) -> None:
    """Where traffic stands now. Only "no such service" means no traffic: any other failure to read it (a 403, an
    outage) is said in the report as traffic unknown, never raised (it would hide the run's own outcome)."""
    try:
        service = clients.run_services(target).get_service(name=service_path(target, service_id))
    except gexc.NotFound:
        return  # no service (yet): the report says "no traffic"
    except (gexc.Forbidden, gexc.PermissionDenied) as exc:
        report.traffic_unknown = str(explain_forbidden(exc, "run", "roles/run.viewer", f"reading {service_id}",
                                                       target.project))  # fmt: skip
        return
    except Exception as exc:  # said in the report, not swallowed: the run's own error is what is raised
        report.traffic_unknown = f"reading {service_id} failed: {type(exc).__name__}: {exc}"
        return
    report.service_url = service.uri
    report.traffic = [(s.revision, s.percent) for s in service.traffic_statuses if s.percent and s.tag != CANDIDATE_TAG]


def _publish(report: PromotionReport, target: GcpTarget, service_id: str) -> None:
    """The report and links (service URL, Cloud Run console, Cloud Build log) as artifacts, an event automations can
    act on, and the outcome as the log's last line."""
    create_markdown_artifact(
        report.markdown(), key=artifact_key(f"promotion-{service_id}"), description=f"promotion of {report.model}"
    )
    if report.service_url:
        create_link_artifact(
            report.service_url, link_text=f"{service_id} service URL", key=artifact_key(f"service-{service_id}")
        )
    if report.outcome != "dry-run":  # a dry run created nothing to look at in the console
        create_link_artifact(
            report.console_url,
            link_text=f"{service_id} revisions in the Cloud Run console",
            key=artifact_key(f"console-{service_id}"),
        )
    if report.build_log_url:  # the build of this run's image (or its last failed attempt)
        create_link_artifact(
            report.build_log_url,
            link_text=f"Cloud Build log of {report.attempts[-1].build_id}",
            key=artifact_key(f"build-log-{service_id}"),
        )
    events = {"failed": "model.promotion_failed", "rolled-back": "model.rolled_back"}
    event = events.get(report.outcome, "model.promoted")
    if report.outcome != "dry-run":
        emit(event, target, service_id, {
            "model": report.model, "commit": report.commit, "outcome": report.outcome, "reason": report.reason,
            "revision": report.serving_revision, "traffic": report.traffic,
            "steps": [step.model_dump() for step in report.delivery], "quality": quality_payload(report.quality),
        })  # fmt: skip
    # History beyond the Prefect plan's retention, in the bucket the infrastructure step made sure of: a run that did
    # not get that far (refused before any cloud write, a dry run, a bucket in the wrong region) writes nothing there.
    if any(step.name == BUCKET_READY and step.ok for step in report.steps):
        gcs_archive_report(target, report)
    run_logger().info("%s", report.outcome_line())  # the run's last words: what it did, and where traffic stands
