"""doctor against the sandbox: a clean project is all green; each first-run blocker set up in the sandbox is a named
failure with the command that fixes it; and doctor only reads. Real clients over real HTTP throughout."""

from __future__ import annotations

import itertools

import pytest
from google.api_core import exceptions as gexc
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

from blocks.images import ImageBuild
from blocks.profile import ServingProfile
from blocks.target import GcpTarget
from flows.doctor import doctor, main
from tasks.checks import doctor as checks
from tasks.checks.quotas import QuotaExceeded, check_region_quotas
from tasks.common import clients
from tasks.common.permissions import DEPLOYER_ROLES, DOCTOR_ROLES
from tests.support.sandbox_config import sandbox_settings

_ids = itertools.count()
READ_VERBS = (":testIamPermissions", ":getEffectivePolicy", ":batchGet")
L4 = ServingProfile.preset("l4")


@pytest.fixture
def target(sandbox_target) -> GcpTarget:
    """The sandbox target with a bucket and service account of its own (neither exists yet)."""
    n = next(_ids)
    return sandbox_target.model_copy(update={"bucket": f"doctor-test-{n}", "service_account_name": f"doctor-sa-{n}"})


def by_name(rows: list[checks.Check]) -> dict[str, checks.Check]:
    return {row.name: row for row in rows}


def gpu_row(target: GcpTarget, profile: ServingProfile) -> checks.Check:
    """doctor's GPU quota row for ``profile`` (one of check_quotas' rows)."""
    return by_name(checks.check_quotas(target, profile))["GPU quota"]


def all_checks(target: GcpTarget, profile: ServingProfile = L4) -> dict[str, checks.Check]:
    return by_name(
        [
            checks.check_project_access(target),
            checks.check_apis(target, profile),
            checks.check_permissions(target, profile),
            checks.check_act_as(target),
            checks.check_gpu_region(target, profile),
            *checks.check_quotas(target, profile),
            checks.check_build_region(target, profile),
            *checks.check_org_policies(target),
            checks.check_build_identity(target, profile),
            checks.check_bucket(target),
        ]
    )


@pytest.mark.prefect
def test_clean_project_is_all_green_in_the_flow_and_its_table(prefect_api, sb, target):
    target.save("doctor-clean", overwrite=True)
    rows = doctor(target="doctor-clean", profile="l4")
    assert [r.status for r in rows] == ["ok"] * len(rows), [r for r in rows if r.status != "ok"]
    names = {r.name for r in rows}
    assert {"project access", "APIs enabled", "deployer permissions", "actAs on the runtime service account",
            "GPU quota", "org policy gcp.resourceLocations", "bucket location"} <= names  # fmt: skip

    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(like_="doctor-sandbox-project"))
        )
    assert artifacts and artifacts[0].type == "table"
    assert "GPU quota" in str(artifacts[0].data)


@pytest.mark.prefect
def test_disabled_api_is_refused_as_google_does_and_doctor_names_the_enable_command(prefect_api, sb, target):
    with sandbox_settings(sb, disabled_apis=["run.googleapis.com"]):
        with pytest.raises(gexc.Forbidden) as refused:
            clients.run_services(target).list_services(parent=target.location_path)
        assert refused.value.reason == "SERVICE_DISABLED"
        assert refused.value.metadata["service"] == "run.googleapis.com"
        assert refused.value.metadata["consumer"] == "projects/123456789012"
        assert refused.value.message.split(": ", 1)[1].startswith(
            "Cloud Run Admin API has not been used in project 123456789012 before or it is disabled. Enable it by "
            "visiting https://console.developers.google.com/apis/api/run.googleapis.com/overview?project=123456789012 "
            "then retry."
        )
        row = checks.check_apis(target, L4)
        assert row.status == "fail" and "run.googleapis.com" in row.detail
        assert row.fix == "gcloud services enable run.googleapis.com --project sandbox-project"
        target.save("doctor-disabled", overwrite=True)
        assert main(["--target", "doctor-disabled"]) == 1
    # Enabled again: the same call goes through.
    clients.run_services(target).list_services(parent=target.location_path)


def test_missing_role_is_a_named_failure_with_the_grant_command(sb, target):
    roles = [need.role for need in (*DEPLOYER_ROLES, *DOCTOR_ROLES) if need.role != "roles/compute.networkAdmin"]
    with sb.caller_roles(roles):
        row = checks.check_permissions(target, L4)
    assert row.status == "fail"
    assert "roles/compute.networkAdmin" in row.detail and "compute.networks.create" in row.detail
    assert row.fix.startswith("gcloud projects add-iam-policy-binding sandbox-project --member=")
    assert row.fix.endswith("--role=roles/compute.networkAdmin")
    assert row.roles == ["roles/compute.networkAdmin"]  # what doctor's grant block prints for the row
    assert checks.check_permissions(target, L4).status == "ok"  # roles restored


def test_a_project_that_does_not_exist_fails_project_access_naming_the_id_and_roles_browser(sb, target):
    typo = target.model_copy(update={"project": "sandbox-projcet"})
    row = checks.check_project_access(typo)
    assert row.status == "fail" and row.roles == ["roles/browser"]
    assert row.detail.startswith("sandbox-projcet does not exist or you may not see it (Permission ")
    assert "check the project id, or grant roles/browser" in row.detail and "http" not in row.detail


def test_a_denied_read_names_the_permission_and_role_without_googles_request_line(sb, target):
    with sb.caller_roles(["roles/run.admin"]):
        quota = gpu_row(target, L4)
        bucket = checks.check_bucket(target)
        subnet = checks.check_subnet(target)
    assert quota.line == (
        "cannot read: missing permission serviceusage.quotas.get; grant roles/serviceusage.serviceUsageViewer"
    )
    # The whole detail (the artifact) also says what promote-model and scale-service judge by until it can be read.
    assert quota.detail.endswith(
        "Until it can be read, promote-model and scale-service judge by 3 GPUs (a new project's default, assumed; "
        "give the project's quota in gpu_quota)."
    )
    # Storage refuses a bucket it will not name as foreign or ours: the caller's missing project role decides.
    assert bucket.detail == "cannot read: missing permission storage.buckets.get; grant roles/storage.admin"
    assert subnet.status == "fail" and subnet.roles == ["roles/compute.networkAdmin"]


def test_google_text_keeps_the_first_sentence_without_the_request_line():
    message = (
        "GET http://127.0.0.1:1/v1/projects/p/services:batchGet?names=projects%2Fp%2Fservices%2Frun.googleapis.com: "
        "x@y does not have storage.buckets.get access to the Google Cloud Storage bucket. Permission "
        "'storage.buckets.get' denied on resource (or it may not exist)."
    )
    assert checks.google_text(gexc.Forbidden(message)) == (
        "x@y does not have storage.buckets.get access to the Google Cloud Storage bucket."
    )
    assert len(checks.google_text("word " * 100)) == checks.MAX_GOOGLE_TEXT


def test_gpu_quota_below_max_instances_fails_with_the_quota_to_request(sb, target):
    three = L4.model_copy(update={"max_instances": 3})
    with sandbox_settings(sb, gpu_quota={"nvidia-l4": 1, "nvidia-rtx-pro-6000": 1}):
        row = gpu_row(target, three)
    assert row.status == "fail"
    assert (
        "NvidiaL4GpuAllocNoZonalRedundancyPerProjectRegion (run.googleapis.com/nvidia_l4_gpu_allocation_no_zonal_"
        "redundancy) in us-central1: 3 GPU for 3 instance(s) of 1 GPU; the project has 1" in row.detail
    )
    assert '"Max instances must be set to 1 or fewer"' in row.detail
    assert "request NvidiaL4GpuAllocNoZonalRedundancyPerProjectRegion of 3 GPU" in row.fix
    assert "at https://console.cloud.google.com/iam-admin/quotas?project=sandbox-project" in row.fix
    assert "or set the profile's max_instances to 1" in row.fix
    assert gpu_row(target, three).status == "ok"  # the sandbox's Service Usage reports 3 again


# Only the GPU figure is under test: 3 L4 instances (24 vCPU, 96 GiB) exceed a new project's 20 vCPU / 40 GiB.
@pytest.mark.usefixtures("raised_quota")
def test_the_profiles_gpu_quota_counts_only_where_service_usage_cannot_be_read(sb, target):
    """One GPU quota figure for doctor and preflight (tasks/checks/quotas.py): Google's when it can be read, whatever
    the profile says; unread, the profile's gpu_quota, else a new project's default, assumed, and said so."""
    stale = L4.model_copy(update={"max_instances": 3, "gpu_quota": 1})  # a figure the project has outgrown
    read = gpu_row(target, stale)
    assert read.status == "ok" and "the project has 3." in read.detail
    assert "The profile's gpu_quota (1) is not used: the quota read from Google decides" in read.detail
    assert [n.limit for n in check_region_quotas(target, stale) if n.quota.unit == "GPU"] == [3]

    four = L4.model_copy(update={"max_instances": 4})
    stated = four.model_copy(update={"gpu_quota": 6})
    with sb.caller_roles(["roles/run.admin"]):  # no serviceusage.quotas.get
        assumed_row, stated_row = gpu_row(target, four), gpu_row(target, stated)
        with pytest.raises(QuotaExceeded) as refused:
            check_region_quotas(target, four)
        needs = check_region_quotas(target, stated)
    assert assumed_row.status == "fail" and "judge by 3 GPUs (a new project's default, assumed" in assumed_row.detail
    assert (
        "the project has 3 (a new project's default, assumed; give the project's quota in gpu_quota: Service Usage "
        "could not be read)" in str(refused.value)
    )
    assert "or set max_instances to 3 or fewer" in str(refused.value)
    assert stated_row.detail.endswith("judge by 6 GPUs (as gpu_quota gives it).")
    assert [(n.limit, n.fits) for n in needs if n.quota.unit == "GPU"] == [(6, True)]


# A new project's Cloud Run quotas in us-central1: 20 vCPU, 40 GiB (googlecodelabs/feedback#1856, #2311) and one RTX
# Pro 6000, which Service Usage reports as 1000 milli-GPUs.
GOOGLE_DEFAULTS = {"cpu_quota": 20, "memory_quota_gib": 40, "gpu_quota": {"nvidia-l4": 3, "nvidia-rtx-pro-6000": 1}}


def test_on_a_new_projects_quotas_the_rtx_profile_fails_on_memory_and_reads_its_gpu_quota_in_gpus(sb, target):
    rtx = ServingProfile.preset("rtx-pro-6000")
    with sandbox_settings(sb, **GOOGLE_DEFAULTS):
        rows = by_name(checks.check_quotas(target, rtx))
        two = gpu_row(target, rtx.model_copy(update={"max_instances": 2}))
    assert rows["CPU quota"].status == "ok"  # 20 vCPU: exactly one instance
    memory = rows["Memory quota"]
    assert memory.status == "fail"
    assert "MemAllocPerProjectRegion (run.googleapis.com/mem_allocation) in us-central1: 80 GiB" in memory.detail
    assert '"Max instances must be set to 0 or fewer"' in memory.detail
    assert "request MemAllocPerProjectRegion of 85899345920 bytes (80 GiB)" in memory.fix
    assert "pick a profile with a smaller instance" in memory.fix
    # The API's 1000 is one GPU: enough for one instance, not for two.
    assert rows["GPU quota"].status == "ok" and "the project has 1." in rows["GPU quota"].detail
    assert two.status == "fail" and "the project has 1:" in two.detail
    assert "of 2000 milli-GPU (2 GPU)" in two.fix


def test_location_policy_excluding_the_region_fails(sb, target):
    eu_only = {"gcp.resourceLocations": {"rules": [{"values": {"allowedValues": ["in:eu-locations"]}}]}}
    with sandbox_settings(sb, org_policies=eu_only):
        rows = by_name(checks.check_org_policies(target))
    row = rows["org policy gcp.resourceLocations"]
    assert row.status == "fail" and "in:eu-locations" in row.detail
    assert row.fix == (
        "gcloud resource-manager org-policies allow gcp.resourceLocations in:us-central1-locations "
        "--project sandbox-project"
    )
    assert rows["org policy run.allowedVPCEgress"].status == "ok"


def test_egress_policy_refusing_all_traffic_fails(sb, target):
    private_only = {"run.allowedVPCEgress": {"rules": [{"values": {"allowedValues": ["private-ranges-only"]}}]}}
    with sandbox_settings(sb, org_policies=private_only):
        row = by_name(checks.check_org_policies(target))["org policy run.allowedVPCEgress"]
    assert row.status == "fail" and row.fix.endswith("run.allowedVPCEgress all-traffic --project sandbox-project")


def test_existing_bucket_in_another_region_fails(sb, target):
    clients.storage(target).create_bucket(target.bucket_name, location="europe-west4")
    row = checks.check_bucket(target)
    assert row.status == "fail"
    assert f"gs://{target.bucket_name} is in EUROPE-WEST4" in row.detail
    assert row.fix.startswith("set the target's bucket to a new name (created in us-central1)")


def test_doctor_only_reads(sb, target, tmp_path):
    since = sb.last_request_seq()
    rows = all_checks(target)
    assert rows and all(r.status == "ok" for r in rows.values()), rows
    building = ServingProfile.preset("l4", image=None, build=ImageBuild(source_dir=str(tmp_path), image_name="app"))
    assert checks.check_build_identity(target, building).status == "ok"
    calls = [r for r in sb.requests(since=since)]
    assert calls
    writes = [
        f"{r['method']} {r['path']}" for r in calls if r["method"] != "GET" and not r["path"].endswith(READ_VERBS)
    ]
    assert writes == []


def test_the_build_region_row_reads_cloud_builds_regional_cpu_quota(sb, target, tmp_path):
    building = ServingProfile.preset("l4", image=None, build=ImageBuild(source_dir=str(tmp_path), image_name="app"))
    row = checks.check_build_region
    since = sb.last_request_seq()
    default = row(target, building)  # build_region: global, open to every project: nothing to read
    assert default.status == "ok" and "global default pool" in default.detail
    assert not [r for r in sb.requests(since=since) if "consumerQuotaMetrics" in r["path"]]
    kept = row(target.model_copy(update={"build_region": "us-central1"}), building)
    assert kept.status == "ok" and kept.detail == (
        "Concurrent Build CPUs (Regional Default Pool) in us-central1 (build_region): 100 CPUs."
    )
    restricted = row(target.model_copy(update={"build_region": "europe-west4"}), building)
    assert restricted.status == "fail"
    assert restricted.line == (
        "Concurrent Build CPUs (Regional Default Pool) is 0 in europe-west4 (build_region): Cloud Build refuses "
        "builds there."
    )
    assert "FAILED_PRECONDITION 'due to quota restrictions, cannot run builds in this region'" in restricted.detail
    assert restricted.fix.startswith("set the target's build_region to 'global' (the default")
    assert "above 0 in europe-west4 (cloudbuild.googleapis.com/concurrent_public_pool_build_cpus" in restricted.fix
    with sandbox_settings(sb, build_restricted_regions=[]):  # a project Cloud Build does not restrict
        assert row(target.model_copy(update={"build_region": "europe-west4"}), building).status == "ok"
    assert row(target.model_copy(update={"build_region": "europe-west4"}), L4).detail == (
        "pinned image: nothing is built."
    )


def test_service_usage_and_org_policy_answer_as_google(sb, target):
    usage = clients.service_usage(target)
    with sandbox_settings(sb, disabled_apis=["cloudbuild.googleapis.com"]):
        enabled = [s.config.name for s in usage.list_services(request={"parent": "projects/sandbox-project",
                                                                        "filter": "state:ENABLED"})]  # fmt: skip
        build = usage.get_service(request={"name": "projects/sandbox-project/services/cloudbuild.googleapis.com"})
    assert "run.googleapis.com" in enabled and "cloudbuild.googleapis.com" not in enabled
    assert build.name == "projects/123456789012/services/cloudbuild.googleapis.com"
    assert build.state.name == "DISABLED" and build.config.title == "Cloud Build API"
    policy = clients.org_policy(target).get_effective_policy(
        name="projects/sandbox-project/policies/iam.allowedPolicyMemberDomains"
    )
    assert policy.name == "projects/123456789012/policies/iam.allowedPolicyMemberDomains"
    assert [r.allow_all for r in policy.spec.rules] == [True] and not policy.etag


def test_invokers_under_domain_restricted_sharing_are_a_warning(sb, target):
    restricted = {"iam.allowedPolicyMemberDomains": {"rules": [{"values": {"allowedValues": ["C0abc123"]}}]}}
    with_invokers = target.model_copy(update={"invokers": ["group:ml-apps@example.com"]})
    with sandbox_settings(sb, org_policies=restricted):
        row = by_name(checks.check_org_policies(with_invokers))["org policy iam.allowedPolicyMemberDomains"]
    assert row.status == "warn" and "C0abc123" in row.detail and "group:ml-apps@example.com" in row.detail


def test_run_service_unaffected_by_unrelated_disabled_api(sb, target):
    with sandbox_settings(sb, disabled_apis=["secretmanager.googleapis.com"]):
        listed = clients.run_services(target).list_services(parent=target.location_path)
        assert isinstance(list(listed), list)
        with pytest.raises(gexc.Forbidden):
            clients.secret_manager(target).list_secrets(parent=f"projects/{target.project}")


@pytest.mark.prefect
def test_promote_runs_doctor_first_when_the_target_asks_and_stops_before_any_write(prefect_api, sb, target):
    from flows.promote import promote_model

    gated = target.model_copy(update={"doctor_before_promote": True})
    gated.save("doctor-gate", overwrite=True)
    since = sb.last_request_seq()
    with sandbox_settings(sb, disabled_apis=["compute.googleapis.com"]), pytest.raises(checks.DoctorFailed) as failed:
        promote_model(model="sandbox/tiny-chat", target="doctor-gate", service="doctor-gate", hub_endpoint=sb.hub_url)
    assert "gcloud services enable compute.googleapis.com --project sandbox-project" in str(failed.value)
    assert str(failed.value).splitlines()[0] == (
        "doctor: project not ready: APIs enabled: not enabled: compute.googleapis.com. | subnet: "
        "compute.googleapis.com is not enabled, so this could not be checked."
    )
    assert str(failed.value).count("gcloud services enable") == 1  # one cause, one fix
    writes = [r for r in sb.requests(since=since) if r["method"] != "GET" and not r["path"].endswith(READ_VERBS)]
    assert [f"{r['method']} {r['path']}" for r in writes if not r["path"].startswith("/_sandbox")] == []
    # A clean project passes the same gate and the promotion goes on (a dry run stops after rendering).
    report = promote_model(
        model="sandbox/tiny-chat", target="doctor-gate", service="doctor-gate", hub_endpoint=sb.hub_url, dry_run=True
    )
    assert report.outcome == "dry-run" and "doctor" in [s.name for s in report.steps]


def test_build_identity_is_checked_once_it_exists(sb, target, tmp_path):
    from tasks.infra import build_identity, ensure

    n = next(_ids)
    target = target.model_copy(
        update={"build_service_account_name": f"doctor-build-{n}", "artifact_repository": f"doc-{n}"}
    )
    building = ServingProfile.preset("l4", image=None, build=ImageBuild(source_dir=str(tmp_path), image_name="app"))
    first = checks.check_build_identity(target, building)
    assert first.status == "ok" and "will be created by promote" in first.detail
    build_identity.ensure_build_service_account(target)
    ensure.ensure_bucket(target)
    ensure.ensure_build_bucket(target)
    ensure.ensure_artifact_registry(target)
    bare = checks.check_build_identity(target, building)
    assert bare.status == "warn"
    assert f"roles/storage.admin on gs://{target.build_bucket_name}" in bare.detail
    assert "roles/artifactregistry.writer" in bare.detail
    assert (
        f"gcloud storage buckets add-iam-policy-binding gs://{target.build_bucket_name} "
        f"--member=serviceAccount:{target.build_service_account_email} --role=roles/storage.admin"
    ) in bare.fix
    build_identity.ensure_build_identity(target)
    granted = checks.check_build_identity(target, building)
    assert granted.status == "ok" and "holds its roles" in granted.detail
    assert "none on the model bucket" in granted.detail
    bucket = clients.storage(target).bucket(target.bucket_name)  # an earlier version's grant on the model bucket
    policy = bucket.get_iam_policy(requested_policy_version=3)
    member = f"serviceAccount:{target.build_service_account_email}"
    policy.bindings.append({"role": "roles/storage.objectCreator", "members": {member}})
    bucket.set_iam_policy(policy)
    stale = checks.check_build_identity(target, building)
    assert stale.status == "warn" and f"holds roles/storage.objectCreator on gs://{target.bucket_name}" in stale.detail
    assert (
        f"gcloud storage buckets remove-iam-policy-binding gs://{target.bucket_name} --member={member} "
        "--role=roles/storage.objectCreator"
    ) in stale.fix
    build_identity.ensure_build_identity(target)  # promote's step removes it
    assert checks.check_build_identity(target, building).status == "ok"


def test_service_usage_itself_disabled_is_named_by_the_checks_that_read_through_it(sb, target):
    with sandbox_settings(sb, disabled_apis=["serviceusage.googleapis.com"]):
        apis = checks.check_apis(target, L4)
        quota = gpu_row(target, L4)
        memory = by_name(checks.check_quotas(target, L4))["Memory quota"]
    assert (
        memory.status == "fail"
        and memory.fix == "gcloud services enable serviceusage.googleapis.com --project sandbox-project"
    )
    assert apis.status == "fail" and apis.fix.startswith("gcloud services enable ") and "run.googleapis.com" in apis.fix
    assert (
        quota.status == "fail"
        and quota.fix == "gcloud services enable serviceusage.googleapis.com --project sandbox-project"
    )
