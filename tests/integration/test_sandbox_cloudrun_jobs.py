"""Cloud Run jobs in the sandbox, through the clients that call them: googleapiclient's run v2 client built from the
static discovery document (what prefect-gcp's cloud-run-v2 worker uses) and google-cloud-run's JobsClient.

A job's tasks run their container command as local processes: exit codes, retries, the task timeout, cancellation,
the job's env and secrets, and its identity (the metadata server answers as the job's service account, whose tokens
the APIs then judge). Every response is held to run.v2's schema by the session sandbox (tests/conftest.py).
"""

from __future__ import annotations

import base64
import itertools
import json
import re
import time

import httpx
import pytest
from google.api_core import exceptions
from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import run_v2
from google.oauth2 import service_account
from googleapiclient import discovery
from googleapiclient.errors import HttpError

from tasks.common import clients
from tests.support.jobs import completed, create, logs, python_job, run_to_completion

_ids = itertools.count()


@pytest.fixture(scope="module")
def locations(sandbox):
    """The worker's client: ``discovery.build("run", "v2")`` (static document, httplib2) at the sandbox."""
    options = ClientOptions(api_endpoint=sandbox.info["control_url"])
    client = discovery.build("run", "v2", client_options=options, credentials=AnonymousCredentials())
    return client.projects().locations()


@pytest.fixture
def parent(sandbox_target) -> str:
    return sandbox_target.location_path


def test_a_job_runs_its_tasks_and_reports_what_the_worker_reads(sandbox, locations, parent):
    code = "import os; print('task', os.environ['CLOUD_RUN_TASK_INDEX'], 'of', os.environ['CLOUD_RUN_TASK_COUNT'])"
    job = create(locations, parent, python_job(code, taskCount=2))
    got = locations.jobs().get(name=job).execute()
    # What prefect-gcp's JobV2.get reads as required keys, and its readiness test.
    assert got["terminalCondition"]["type"] == "Ready" and got["terminalCondition"]["state"] == "CONDITION_SUCCEEDED"
    assert got["latestCreatedExecution"] == {} and isinstance(got["generation"], str) and got["etag"]
    execution = run_to_completion(locations, job)
    assert completed(execution)["state"] == "CONDITION_SUCCEEDED"
    assert re.fullmatch(r"Execution completed successfully in [\dm.]+s\.", completed(execution)["message"])
    assert execution["succeededCount"] == 2 and execution["taskCount"] == 2 and execution["parallelism"] == 2
    suffix = "[bcdfghjklmnpqrstvwxz2456789]{5}"
    assert re.fullmatch(rf"{job.rsplit('/', 1)[1]}-{suffix}", execution["name"].rsplit("/")[-1])
    text = logs(sandbox, execution)
    assert "task 0 of 2" in text and "task 1 of 2" in text
    after = locations.jobs().get(name=job).execute()
    assert after["executionCount"] == 1
    assert after["latestCreatedExecution"]["name"] == execution["name"]
    assert after["latestCreatedExecution"]["completionStatus"] == "EXECUTION_SUCCEEDED"
    # The worker's clean-up: list the executions, delete each, then the job.
    listed = locations.jobs().executions().list(parent=job).execute()["executions"]
    assert [e["name"] for e in listed] == [execution["name"]]
    locations.jobs().executions().delete(name=execution["name"]).execute()
    locations.jobs().delete(name=job).execute()
    with pytest.raises(HttpError) as missing:
        locations.jobs().get(name=job).execute()
    assert missing.value.status_code == 404


def test_a_failing_task_is_retried_then_fails_the_execution_with_its_exit_code(sandbox, locations, parent):
    code = "import os, sys; print('attempt', os.environ['CLOUD_RUN_TASK_ATTEMPT']); sys.exit(3)"
    execution = run_to_completion(locations, create(locations, parent, python_job(code, maxRetries=1)))
    condition = completed(execution)
    assert condition["state"] == "CONDITION_FAILED" and condition["executionReason"] == "NON_ZERO_EXIT_CODE"
    short = execution["name"].rsplit("/", 1)[1]
    assert condition["message"] == (
        f"Task {short}-task0 failed with exit code: 3 and message: The container exited with an error."
    )
    assert execution["failedCount"] == 1 and execution["retriedCount"] == 1 and "succeededCount" not in execution
    assert "attempt 0" in logs(sandbox, execution) and "attempt 1" in logs(sandbox, execution)


def test_a_task_past_its_timeout_is_stopped_with_cloud_runs_message(locations, parent):
    code = "import time; print('working', flush=True); time.sleep(600)"
    started = time.monotonic()
    execution = run_to_completion(locations, create(locations, parent, python_job(code, timeout="2s")))
    assert time.monotonic() - started < 300  # the 600 s sleep did not run out: the task was stopped
    short = execution["name"].rsplit("/", 1)[1]
    assert completed(execution)["message"] == (
        f"Task {short}-task0 failed with exit code: 0 and message: The configured timeout was reached."
    )
    assert "executionReason" not in completed(execution)


def test_a_cancelled_execution_stops_its_tasks(locations, parent):
    job = create(locations, parent, python_job("import time; print('up', flush=True); time.sleep(600)"))
    name = locations.jobs().run(name=job, body={}).execute()["metadata"]["name"]
    deadline = time.monotonic() + 120
    while locations.jobs().executions().get(name=name).execute().get("runningCount") != 1:
        assert time.monotonic() < deadline, "the task never started"
        time.sleep(0.1)
    locations.jobs().executions().cancel(name=name, body={}).execute()
    execution = locations.jobs().executions().get(name=name).execute()
    assert "completionTime" in execution and execution["cancelledCount"] == 1
    assert completed(execution)["executionReason"] == "CANCELLED"
    assert completed(execution)["message"] == "Cancelled by user."


def test_deleting_a_running_job_stops_it_and_the_watcher_gets_404(locations, parent):
    """What kill_infrastructure does: delete the executions and the job; the watching worker's next get is a 404."""
    job = create(locations, parent, python_job("import time; time.sleep(600)"))
    name = locations.jobs().run(name=job, body={}).execute()["metadata"]["name"]
    locations.jobs().executions().delete(name=name).execute()
    locations.jobs().delete(name=job).execute()
    with pytest.raises(HttpError) as gone:
        locations.jobs().executions().get(name=name).execute()
    assert gone.value.status_code == 404


@pytest.mark.usefixtures("grants_propagated")  # the secret is granted raw right before the run, with no product wait
def test_the_task_env_has_the_jobs_secrets_and_identity(sb, sandbox, locations, parent, sandbox_target, iam_propagated):
    from tasks.infra import ensure

    email = f"job-runner@{sandbox_target.project}.iam.gserviceaccount.com"
    account = ensure.get_or_create_service_account(sandbox_target, "job-runner", email, "job runner", "tests")
    manager = clients.secret_manager(sandbox_target)
    secret = manager.create_secret(
        parent=f"projects/{sandbox_target.project}", secret_id=f"job-secret-{next(_ids)}",
        secret={"replication": {"automatic": {}}},
    )  # fmt: skip
    manager.add_secret_version(parent=secret.name, payload={"data": b"s3cret"})
    code = (
        "import os, urllib.request as u\n"
        "r = u.Request('http://' + os.environ['GCE_METADATA_HOST'] + '/computeMetadata/v1/instance/service-accounts/"
        "default/email', headers={'Metadata-Flavor': 'Google'})\n"
        "print('identity', u.urlopen(r).read().decode()); print('secret', os.environ['TOKEN'])"
    )
    body = python_job(code, serviceAccount=account.name)
    body["template"]["template"]["containers"][0]["env"] = [
        {"name": "TOKEN", "valueSource": {"secretKeyRef": {"secret": secret.name, "version": "latest"}}}
    ]
    job = create(locations, parent, body)
    refused = run_to_completion(locations, job)  # the account may not read the secret yet
    assert "Permission denied on secret" in completed(refused)["message"]
    policy = manager.get_iam_policy(request={"resource": secret.name})
    policy.bindings.add(role="roles/secretmanager.secretAccessor", members=[f"serviceAccount:{account.name}"])
    manager.set_iam_policy(request={"resource": secret.name, "policy": policy})
    execution = run_to_completion(locations, job)
    assert completed(execution)["state"] == "CONDITION_SUCCEEDED", completed(execution)
    text = logs(sandbox, execution)
    assert f"identity {account.name}" in text and "secret s3cret" in text


def test_a_keys_token_acts_as_its_account_and_is_refused_what_it_lacks(sb, sandbox, sandbox_target, iam_propagated):
    """A key from IAM's keys.create gets a token at the key's token_uri; the APIs then judge that account."""
    email, credentials, key = keyed_account(sandbox, sandbox_target, "keyed")
    assert key["client_email"] == email and key["token_uri"] == f"{sandbox.info['control_url']}/token"
    # The worker's client refreshes a token at the key's token_uri; the GAPIC client sends a self-signed JWT instead.
    worker_client = (
        discovery.build(
            "run", "v2", credentials=credentials, client_options=ClientOptions(api_endpoint=sandbox.info["control_url"])
        )
        .projects()
        .locations()
    )
    jobs = run_v2.JobsClient(
        transport="rest", credentials=credentials, client_options={"api_endpoint": sandbox.info["control_url"]}
    )
    denied = f"Permission 'run.jobs.list' denied on resource '{sandbox_target.location_path}'"
    with pytest.raises(HttpError, match=re.escape(denied)):
        worker_client.jobs().list(parent=sandbox_target.location_path).execute()
    assert credentials.token.startswith("ya29.sandbox-")  # from the token endpoint
    with pytest.raises(exceptions.Forbidden, match=re.escape(denied)):
        list(jobs.list_jobs(parent=sandbox_target.location_path))
    sb.set_caller_roles(["roles/run.developer"], member=f"serviceAccount:{email}")
    assert "jobs" in worker_client.jobs().list(parent=sandbox_target.location_path).execute()
    assert list(jobs.list_jobs(parent=sandbox_target.location_path))


def test_creating_a_job_needs_act_as_on_its_account(sb, locations, parent):
    other = "nobody-here@sandbox-project.iam.gserviceaccount.com"
    with pytest.raises(HttpError) as refused:
        create(locations, parent, python_job("pass", serviceAccount=other))
    assert refused.value.status_code == 403
    assert f"Permission 'iam.serviceaccounts.actAs' denied on service account {other}" in str(refused.value)


def test_the_jobs_client_sees_the_same_jobs(sandbox_target, locations, parent):
    job = create(locations, parent, python_job("print('hi')"))
    client = run_v2.JobsClient(
        transport="rest",
        credentials=AnonymousCredentials(),
        client_options={"api_endpoint": sandbox_target.endpoint("run")},
    )
    got = client.get_job(name=job)
    assert got.terminal_condition.state == run_v2.Condition.State.CONDITION_SUCCEEDED
    assert got.template.template.max_retries == 0 and got.template.task_count == 1
    assert got.template.template.timeout.total_seconds() == 600  # Cloud Run's default task timeout


def test_the_run_operation_fails_with_the_failed_tasks_message_and_returns_a_success(sandbox_target, locations, parent):
    """What ``run_job(...).result()`` callers see (apache/airflow's CloudRunExecuteJobOperator waits this way): a failed
    execution fails the operation (google.rpc.Status 13, the task's message), a successful one returns the Execution,
    and a cancelled one completes it without an error (airflow PR 67050)."""
    client = run_v2.JobsClient(
        transport="rest",
        credentials=AnonymousCredentials(),
        client_options={"api_endpoint": sandbox_target.endpoint("run")},
    )
    polling = clients.operation_polling(sandbox_target)
    failing = client.run_job(name=create(locations, parent, python_job("import sys; sys.exit(2)")))
    with pytest.raises(exceptions.InternalServerError) as caught:
        failing.result(timeout=300, polling=polling)
    execution = locations.jobs().executions().get(name=failing.metadata.name).execute()
    short = execution["name"].rsplit("/", 1)[1]
    assert caught.value.message == (
        f"Task {short}-task0 failed with exit code: 2 and message: The container exited with an error."
    )
    assert caught.value.message == completed(execution)["message"]
    succeeded = client.run_job(name=create(locations, parent, python_job("print('fine')"))).result(
        timeout=300, polling=polling
    )
    assert succeeded.succeeded_count == 1 and succeeded.completion_time
    sleeping = client.run_job(name=create(locations, parent, python_job("import time; time.sleep(600)")))
    locations.jobs().executions().cancel(name=sleeping.metadata.name, body={}).execute()
    cancelled = sleeping.result(timeout=300, polling=polling)
    assert cancelled.cancelled_count == 1 and not cancelled.succeeded_count


def keyed_account(sandbox, sandbox_target, name: str) -> tuple[str, service_account.Credentials, dict]:
    """A new service account with a key from IAM's keys.create: its email, credentials, and the key file."""
    from tasks.infra import ensure

    email = f"{name}-{next(_ids)}@{sandbox_target.project}.iam.gserviceaccount.com"
    ensure.get_or_create_service_account(sandbox_target, email.split("@")[0], email, name, "tests")
    made = httpx.post(f"{sandbox.info['control_url']}/v1/projects/-/serviceAccounts/{email}/keys", json={}, timeout=30)
    key = json.loads(base64.b64decode(made.json()["privateKeyData"]))
    scopes = ["https://www.googleapis.com/auth/cloud-platform"]
    return email, service_account.Credentials.from_service_account_info(key, scopes=scopes), key


@pytest.mark.usefixtures("grants_propagated")  # the job's invoker role is granted raw right before the run
def test_a_jobs_own_policy_lets_an_account_run_it(sb, sandbox, sandbox_target, locations, parent, iam_propagated):
    email, credentials, _ = keyed_account(sandbox, sandbox_target, "runs-one-job")
    theirs = (
        discovery.build(
            "run", "v2", credentials=credentials, client_options=ClientOptions(api_endpoint=sandbox.info["control_url"])
        )
        .projects()
        .locations()
    )
    job = create(locations, parent, python_job("print('ran')"))
    with pytest.raises(HttpError, match=re.escape("Permission 'run.jobs.run' denied")):
        theirs.jobs().run(name=job, body={}).execute()
    policy = locations.jobs().getIamPolicy(resource=job).execute()
    policy["bindings"] = [{"role": "roles/run.invoker", "members": [f"serviceAccount:{email}"]}]
    locations.jobs().setIamPolicy(resource=job, body={"policy": policy}).execute()
    assert theirs.jobs().run(name=job, body={}).execute()["metadata"]["name"].startswith(f"{job}/executions/")
    other = create(locations, parent, python_job("print('not yours')"))
    with pytest.raises(HttpError, match=re.escape("Permission 'run.jobs.run' denied")):
        theirs.jobs().run(name=other, body={}).execute()  # the grant is on that one job only


def test_a_keys_id_token_names_its_account_for_the_audience(sb, sandbox, sandbox_target, iam_propagated):
    """What the product's verify step sends a private service from a key (clients.identity_token)."""
    from google.auth import jwt
    from prefect_gcp import GcpCredentials

    email, _, key = keyed_account(sandbox, sandbox_target, "id-tokens")
    target = sandbox_target.model_copy(
        update={"anonymous_credentials": False, "gcp_credentials": GcpCredentials(service_account_info=key)}
    )
    audience = "https://some-service-123456789012.us-central1.run.app"
    claims = jwt.decode(clients.identity_token(target, audience).get_secret_value(), verify=False)
    assert (claims["email"], claims["aud"]) == (email, audience)
    assert clients.principal(target) == f"serviceAccount:{email}"


def test_an_execution_cancelled_while_pending_runs_nothing(sandbox, locations, parent):
    """Until its first task starts (provisioning: job_start_seconds) an execution is pending; cancelled then, no
    task ever runs and every one counts as cancelled."""
    from tests.support.sandbox_config import config_setter

    with config_setter(sandbox, "job_start_seconds") as start_after:
        start_after(60_000)  # 10 real minutes at the sandbox's clock: far beyond this test
        job = create(locations, parent, python_job("print('should never run')", taskCount=2))
        name = locations.jobs().run(name=job, body={}).execute()["metadata"]["name"]
        pending = locations.jobs().executions().get(name=name).execute()
        assert [c["type"] for c in pending["conditions"]] == ["Completed"] and "startTime" not in pending
        locations.jobs().executions().cancel(name=name, body={}).execute()
    execution = locations.jobs().executions().get(name=name).execute()
    assert execution["cancelledCount"] == 2 and "startTime" not in execution
    assert completed(execution)["message"] == "Cancelled by user."
    assert logs(sandbox, execution) == ""
