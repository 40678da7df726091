"""The production topology for real (`make worker-e2e`): prefect-gcp's cloud-run-v2 worker, unpatched, runs flow runs
as Cloud Run jobs of the sandbox, reached through its TLS face inside a private network namespace.

Collected only inside such a namespace (`python -m sandbox.netns -- pytest tests/worker`, which `make worker-e2e`
does; it says why and skips where namespaces are not allowed). Everything the worker talks to lives in that
namespace: the sandbox (`--tls-names`: https://run.googleapis.com and https://oauth2.googleapis.com on 127.0.0.1:443)
and a real `prefect server start`. The project is set up as docs/production.md says for a team:
`python -m flows.bootstrap gcp --pool-type cloud-run-v2 --build-worker-image --key-file KEY`, where KEY is a key of
the pipeline's runner account made with IAM's keys.create (its token_uri is Google's token endpoint, which the TLS
face answers).
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox.handle import SandboxHandle
from sandbox.netns import ADDRESS_ENV, in_private_namespace
from tests.conftest import conforming_sandbox
from tests.support.prefect_server import prefect_server
from tests.support.worker import Pipeline, bootstrap_pipeline

collect_ignore_glob = [] if in_private_namespace() else ["test_*.py"]

ROOT = Path(__file__).resolve().parents[2]
PREFECT = str(Path(sys.executable).parent / "prefect")


@pytest.fixture(scope="session")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandboxHandle]:
    """The session sandbox, also answering as Google's API host names over TLS (port 443 of this namespace)."""
    with conforming_sandbox(tmp_path_factory.mktemp("sandbox-worker"), "--tls-names") as handle:
        yield handle


@pytest.fixture(scope="session")
def trust(sandbox: SandboxHandle) -> dict[str, str]:
    """What a host that runs the worker trusts: here the sandbox's throwaway CA (httplib2 reads only its own
    variable; requests, for google-auth's token refresh, its own)."""
    ca = sandbox.info["tls"]["ca_file"]
    return {"HTTPLIB2_CA_CERTS": ca, "REQUESTS_CA_BUNDLE": ca, "SSL_CERT_FILE": ca}


@pytest.fixture(scope="session")
def prefect(tmp_path_factory: pytest.TempPathFactory, trust: dict[str, str]) -> Iterator[dict[str, str]]:
    """A real Prefect server; the environment a CLI command or the worker runs with."""
    home = tmp_path_factory.mktemp("prefect-home")
    # As a team runs it: a server its Cloud Run jobs reach, at a private address of its VPC (bootstrap refuses a
    # loopback one for a cloud-run-v2 pool). `make worker-e2e` gives the namespace one (sandbox.netns --address).
    host = os.environ.get(ADDRESS_ENV)
    assert host, (
        f"no private address in this namespace: run `make worker-e2e` (sandbox.netns --address sets {ADDRESS_ENV})"
    )
    # A self-hosted server with basic auth, as a team's on a VPC is: bootstrap keeps the auth string in Secret Manager
    # and the pool's jobs get a reference to it (tasks/report/prefect_api.py), never the value.
    auth = f"e2e:{secrets.token_urlsafe(18)}"
    server = {"PREFECT_SERVER_API_AUTH_STRING": auth}
    # Runs are picked up every 2 s rather than 10: the worker's own 5 s polls of Cloud Run are untouched.
    with prefect_server(
        home, host, server, PREFECT_API_AUTH_STRING=auth, PREFECT_WORKER_QUERY_SECONDS="2", **trust
    ) as env:
        yield env


@pytest.fixture(scope="session")
def pipeline(sandbox: SandboxHandle, prefect: dict[str, str], tmp_path_factory) -> Pipeline:
    """The project bootstrapped for a cloud-run-v2 pool, as a team does it."""
    return bootstrap_pipeline(sandbox, prefect, tmp_path_factory.mktemp("pipeline"))


@pytest.fixture(scope="session")
def worker(pipeline: Pipeline, prefect: dict[str, str], tmp_path_factory) -> Iterator[Path]:
    """`prefect worker start --pool hf-pipeline --type cloud-run-v2`, prefect-gcp's own worker; its log file."""
    log_path = tmp_path_factory.mktemp("worker") / "worker.log"
    # Cancellation as docs/production.md describes it: the worker kills the job of a run cancelled while it submits it.
    env = {**prefect, "PREFECT_WORKER_ENABLE_CANCELLATION": "true"}
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [PREFECT, "worker", "start", "--pool", pipeline.pool, "--type", "cloud-run-v2", "--name", "e2e-worker"],
            env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    try:
        yield log_path
    finally:
        process.terminate()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
