"""Fixtures of the integration tests: for raw Cloud Run calls (no flow), the tiny model in the bucket their services
mount and a service id whose service is deleted after the test; for bootstrap's, the sandbox's endpoints file and the
work pool bootstrap creates."""

from __future__ import annotations

import contextlib
import itertools
import json
from collections.abc import Iterator

import pytest
from google.api_core import exceptions
from google.cloud import run_v2
from prefect.client.orchestration import get_client
from prefect.exceptions import ObjectNotFound

from tasks.common import clients
from tests.support.models import tiny_model_files, upload_model

_ids = itertools.count()


@pytest.fixture(scope="module")
def services(request: pytest.FixtureRequest, sandbox_target) -> run_v2.ServicesClient:
    """The Admin API's services client, with the tiny model uploaded to the module's ``BUCKET`` (where
    tests.support.services' specs mount it)."""
    upload_model(clients.storage(sandbox_target), request.module.BUCKET, "models/tiny", tiny_model_files())
    return clients.run_services(sandbox_target)


@pytest.fixture
def service_id(sb, services, sandbox_target) -> Iterator[str]:
    """A fresh service id; what earlier tests left idle is gone first (Cloud Run's idle time has passed), and the
    service is deleted afterwards (instances stop, URLs close)."""
    sb.run("POST", "/idle")
    name = f"run-{next(_ids)}"
    yield name
    with contextlib.suppress(exceptions.NotFound):
        services.delete_service(name=f"{sandbox_target.location_path}/services/{name}").result(
            polling=clients.operation_polling(sandbox_target)
        )


@pytest.fixture
def endpoints(sandbox, tmp_path) -> str:
    """The sandbox's API endpoints as a file, for bootstrap's --endpoints."""
    path = tmp_path / "endpoints.json"
    path.write_text(json.dumps(sandbox.info["target"]["endpoints"]))
    return str(path)


@pytest.fixture
def cloud_run_pool(prefect_api) -> Iterator[str]:
    """The pool bootstrap creates (prefect.yaml's definitions.work_pools.pipeline), absent before the test and deleted
    after."""
    with get_client(sync_client=True) as client, contextlib.suppress(ObjectNotFound):
        client.delete_work_pool("hf-pipeline")
    yield "hf-pipeline"
    with get_client(sync_client=True) as client, contextlib.suppress(ObjectNotFound):
        client.delete_work_pool("hf-pipeline")
