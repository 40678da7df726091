"""Cloud Run job tasks in networks of their own, when the sandbox serves on a private address (`make worker-e2e`'s
topology: ``python -m sandbox.netns --address``; sandbox/control/run/task_network.py).

On Cloud Run a job's container has its own network: the team's Prefect server is reached at its VPC address, and
127.0.0.1 is the container's own loopback. The outer test re-runs this module under the runner with a private
address; inside, the session sandbox serves on that address and the tests run jobs whose tasks connect to a server
on the namespace's 127.0.0.1 (refused: the task's loopback is its own) and to one on the private address (reached).
"""

from __future__ import annotations

import ipaddress
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox.control.run.task_network import LINK_POOL
from sandbox.netns import ADDRESS_ENV, in_private_namespace, namespaces_available
from tests.support.jobs import completed, create, logs, python_job, run_to_completion

REPO = Path(__file__).resolve().parents[2]
ADDRESS = "10.99.0.1/24"
INSIDE = in_private_namespace() and bool(os.environ.get(ADDRESS_ENV))
NETNS_REASON = namespaces_available()
inside_only = pytest.mark.skipif(not INSIDE, reason="runs under `python -m sandbox.netns --address` (the outer test)")

# The task's side: its identity from the job's metadata server (the sandbox), then connect, say hello, and print
# what the server answered (its view of the task's address).
CONNECT = """
import os, socket, sys, urllib.request
url = f"http://{os.environ['GCE_METADATA_HOST']}/computeMetadata/v1/instance/service-accounts/default/email"
request = urllib.request.Request(url, headers={"Metadata-Flavor": "Google"})
print("identity:", urllib.request.urlopen(request, timeout=30).read().decode())
with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=30) as s:
    s.sendall(b"hello")
    print("answer:", s.recv(100).decode())
"""


def connecting_job(locations, parent: str, host: str, port: int) -> str:
    """A job whose task runs ``CONNECT`` against ``host:port``."""
    body = python_job(CONNECT)
    body["template"]["template"]["containers"][0]["args"] = [host, str(port)]
    return create(locations, parent, body)


@pytest.mark.skipif(INSIDE, reason="this is the outer test; the inner ones run here")
@pytest.mark.skipif(NETNS_REASON is not None, reason=f"no private namespaces here: {NETNS_REASON}")
def test_job_tasks_have_their_own_network_under_the_runner() -> None:
    """The module's inner tests pass in a namespace with a private address (their output is shown on failure)."""
    command = [sys.executable, "-m", "sandbox.netns", "--address", ADDRESS, "--"]
    command += [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, f"inner run failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
    assert "2 passed" in result.stdout, result.stdout


class Listener:
    """A TCP server on ``host`` that answers each connection with the peer's address, and remembers the peers."""

    def __init__(self, host: str) -> None:
        self.sock = socket.create_server((host, 0))
        self.host, self.port = self.sock.getsockname()[:2]
        self.peers: list[str] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, peer = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.recv(100)
                self.peers.append(peer[0])
                conn.sendall(peer[0].encode())


@pytest.fixture
def listener(request: pytest.FixtureRequest) -> Iterator[Listener]:
    server = Listener(request.param)
    # The server is there: this namespace itself reaches it (so a refusal from the task is the task's network).
    socket.create_connection((server.host, server.port), timeout=10).close()
    yield server
    server.sock.close()


@pytest.fixture(scope="module")
def locations(sandbox):
    from google.api_core.client_options import ClientOptions
    from google.auth.credentials import AnonymousCredentials
    from googleapiclient import discovery

    options = ClientOptions(api_endpoint=sandbox.info["control_url"])
    return (
        discovery.build("run", "v2", client_options=options, credentials=AnonymousCredentials()).projects().locations()
    )


@inside_only
@pytest.mark.parametrize("listener", ["127.0.0.1"], indirect=True)
def test_a_task_cannot_reach_the_namespaces_loopback(sandbox, locations, sandbox_target, listener) -> None:
    """A job pointed at the loopback (a Prefect server on 127.0.0.1) fails: its 127.0.0.1 is its own, as on Cloud
    Run's."""
    assert sandbox.info["control_url"].startswith(f"http://{os.environ[ADDRESS_ENV]}:")  # the sandbox moved too
    job = connecting_job(locations, sandbox_target.location_path, "127.0.0.1", listener.port)
    execution = run_to_completion(locations, job)
    assert completed(execution)["state"] == "CONDITION_FAILED"
    stderr = logs(sandbox, execution, "stderr")
    assert "ConnectionRefusedError" in stderr, stderr
    assert "identity:" in logs(sandbox, execution)  # the sandbox itself was reached: only the loopback was not
    assert listener.peers == ["127.0.0.1"]  # only the fixture's own check ever arrived


@inside_only
@pytest.mark.parametrize("listener", [os.environ.get(ADDRESS_ENV, "")], indirect=True)
def test_a_task_reaches_the_private_address_from_its_own(sandbox, locations, sandbox_target, listener) -> None:
    """A job pointed at the private address (a Prefect server on the team's VPC) connects, from an address of its
    own link."""
    job = connecting_job(locations, sandbox_target.location_path, listener.host, listener.port)
    execution = run_to_completion(locations, job)
    assert completed(execution)["state"] == "CONDITION_SUCCEEDED", logs(sandbox, execution, "stderr")
    task_address = listener.peers[-1]
    assert ipaddress.ip_address(task_address) in LINK_POOL  # the task's end of its own link, not the namespace's
    stdout = logs(sandbox, execution)
    assert f"answer: {task_address}" in stdout and "identity:" in stdout, stdout
