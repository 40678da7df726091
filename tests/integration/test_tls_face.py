"""The sandbox's TLS face (sandbox/tls.py) and the private namespace runner (sandbox/netns.py).

Clients that hard-code Google's host names (prefect-gcp's Cloud Run worker: https://run.googleapis.com over
httplib2) reach the sandbox only if those names resolve to it and its certificate verifies. These tests check
the certificate against its throwaway CA for every name, that the runner's hosts file works inside its namespace
and never touches the machine's /etc/hosts, and, end to end, an unpatched googleapiclient inside a namespace
listing Cloud Run services at https://run.googleapis.com.
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import stat
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from sandbox.netns import namespaces_available, netns_command
from sandbox.serving import serve_app
from sandbox.tls import STORAGE_NAME, TLS_NAMES, HostRouter, TlsMaterial, hosts_file_text, make_tls_material

REPO = Path(__file__).resolve().parents[2]
SANDBOX_START_S = 120  # a loaded machine starts the sandbox (and fake-gcs-server) slowly
NETNS_REASON = namespaces_available()
needs_netns = pytest.mark.skipif(NETNS_REASON is not None, reason=f"no private namespaces here: {NETNS_REASON}")


def _echo_app(label: str) -> Starlette:
    """An app that says which one it is and which Host it saw."""

    async def echo(request: Request) -> JSONResponse:
        return JSONResponse({"app": label, "host": request.headers.get("host")})

    return Starlette(routes=[Route("/{path:path}", echo)])


def _get_all(material: TlsMaterial, names: list[str | None], trust: Path) -> dict[str | None, dict | str]:
    """Serve the TLS router with ``material``; GET / once per name (SNI and Host set to it; None: plain
    127.0.0.1), each on a new connection, trusting only ``trust``. Per name: the JSON answer or the error text."""

    async def run() -> dict[str | None, dict | str]:
        router = HostRouter(_echo_app("control"), {STORAGE_NAME: _echo_app("gcs")})
        served = await serve_app(
            router, "tls-test", 0, ssl_certfile=str(material.cert_file), ssl_keyfile=str(material.key_file)
        )
        results: dict[str | None, dict | str] = {}
        try:
            assert served.url.startswith("https://127.0.0.1:")
            port = served.url.rsplit(":", 1)[1]
            for name in names:
                # A new client per name: a pooled connection would skip the handshake that checks the name.
                async with httpx.AsyncClient(verify=ssl.create_default_context(cafile=str(trust))) as client:
                    kwargs: dict = {}
                    if name is not None:
                        kwargs = {"headers": {"Host": f"{name}:{port}"}, "extensions": {"sni_hostname": name}}
                    try:
                        response = await client.get(f"{served.url}/ping", **kwargs)
                        results[name] = response.json()
                    except httpx.HTTPError as exc:
                        results[name] = str(exc)
        finally:
            await served.stop()
        return results

    return asyncio.run(run())


# --- certificates and routing ------------------------------------------------------------------------------------


def test_certificate_verifies_for_every_google_name_and_routes_by_host(tmp_path: Path) -> None:
    material = make_tls_material(tmp_path / "tls", TLS_NAMES)
    results = _get_all(material, [*TLS_NAMES, None, "www.google.com"], trust=material.ca_file)

    for name in TLS_NAMES:
        assert isinstance(results[name], dict), f"{name}: {results[name]}"
        expected = "gcs" if name == STORAGE_NAME else "control"
        assert results[name]["app"] == expected, name
    assert isinstance(results[None], dict), results[None]  # IP SAN: https://127.0.0.1:PORT verifies too
    assert results[None]["app"] == "control"
    # A name the certificate does not carry fails the handshake, CA or not.
    assert "Hostname mismatch" in results["www.google.com"], results["www.google.com"]


def test_certificate_from_another_ca_is_refused(tmp_path: Path) -> None:
    material = make_tls_material(tmp_path / "tls", TLS_NAMES)
    stranger = make_tls_material(tmp_path / "other", TLS_NAMES)  # a new CA per sandbox start: never trusted across
    results = _get_all(material, ["run.googleapis.com"], trust=stranger.ca_file)
    assert isinstance(results["run.googleapis.com"], str)
    assert "CERTIFICATE_VERIFY_FAILED" in results["run.googleapis.com"]


def test_tls_material_files(tmp_path: Path) -> None:
    from cryptography import x509

    material = make_tls_material(tmp_path / "tls", TLS_NAMES)
    for key in (material.key_file, tmp_path / "tls" / "ca-key.pem"):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600, key
    ca = x509.load_pem_x509_certificate(material.ca_file.read_bytes())
    leaf = x509.load_pem_x509_certificate(material.cert_file.read_bytes())
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert ca.extensions.get_extension_for_class(x509.KeyUsage).value.key_cert_sign
    leaf.verify_directly_issued_by(ca)
    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == list(TLS_NAMES)
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    eku = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert x509.oid.ExtendedKeyUsageOID.SERVER_AUTH in eku


def test_hosts_file_text_maps_names_to_loopback() -> None:
    text = hosts_file_text(["a.example", "b.example", "a.example"])
    lines = [line.split() for line in text.splitlines() if line and not line.startswith("#")]
    assert ["127.0.0.1", "localhost"] in lines
    assert [line for line in lines if line[1].endswith(".example")] == [
        ["127.0.0.1", "a.example"],
        ["127.0.0.1", "b.example"],
    ]


def test_host_router_ignores_port_and_case() -> None:
    router = HostRouter("default", {"Storage.googleapis.com": "gcs"})
    assert router.app_for("storage.googleapis.com") == "gcs"
    assert router.app_for("run.googleapis.com") == "default"


# --- the private namespace runner --------------------------------------------------------------------------------

INSIDE_CHECK = """
import os, socket
assert os.environ.get("SANDBOX_NETNS") == "1"
for name in ("run.googleapis.com", "storage.googleapis.com", "extra.example"):
    assert socket.gethostbyname(name) == "127.0.0.1", name
# The namespace's own loopback is up: a listener accepts a connection.
with socket.create_server(("127.0.0.1", 0)) as server:
    socket.create_connection(server.getsockname(), timeout=5).close()
print("inside ok")
"""


@needs_netns
def test_netns_maps_names_inside_and_leaves_the_machine_alone(tmp_path: Path) -> None:
    hosts = Path("/etc/hosts")
    before = hosts.read_bytes()
    scratch = tmp_path / "tmp"  # where the runner writes its hosts file (TMPDIR), to see that it is gone after
    scratch.mkdir()
    result = subprocess.run(
        netns_command([sys.executable, "-c", INSIDE_CHECK], hosts_names=["extra.example"]),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={**os.environ, "TMPDIR": str(scratch)},
    )
    assert result.returncode == 0, result.stderr
    assert "inside ok" in result.stdout
    after = hosts.read_bytes()
    assert after == before
    assert b"run.googleapis.com" not in after
    assert list(scratch.iterdir()) == []  # the hosts file lived on only as the namespace's mount


@needs_netns
def test_netns_exit_status_is_the_commands() -> None:
    result = subprocess.run(netns_command(["sh", "-c", "exit 7"]), timeout=120, cwd=REPO)
    assert result.returncode == 7


# --- end to end: an unpatched Google client inside a namespace ---------------------------------------------------

CLIENT_SCRIPT = """
import json, os, signal, subprocess, sys, time
from pathlib import Path

from sandbox.serving import die_with_parent

state_dir = Path(sys.argv[1])
log = (state_dir / "sandbox.log").open("ab")
sandbox = subprocess.Popen(
    [sys.executable, "-m", "sandbox", "up", "--tls-names", "--quiet", "--state-dir", str(state_dir)],
    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, preexec_fn=die_with_parent,
)
try:
    deadline = time.monotonic() + float(sys.argv[2])
    info_path = state_dir / "sandbox.json"
    while not info_path.exists():
        if sandbox.poll() is not None or time.monotonic() > deadline:
            sys.exit("sandbox did not start:\\n" + (state_dir / "sandbox.log").read_text()[-4000:])
        time.sleep(0.05)
    info = json.loads(info_path.read_text())
    tls = info["tls"]
    assert tls["port"] == 443, tls
    # What the worker's process would be given: trust for the sandbox's CA, nothing else changed. httplib2 reads
    # HTTPLIB2_CA_CERTS when it is imported, hence the imports below.
    os.environ["HTTPLIB2_CA_CERTS"] = tls["ca_file"]

    import google.auth.credentials
    import httpx
    from googleapiclient import discovery

    run = discovery.build(
        "run",
        "v2",
        client_options={"api_endpoint": "https://run.googleapis.com"},
        credentials=google.auth.credentials.AnonymousCredentials(),
    )
    target = info["target"]
    parent = f"projects/{target['project']}/locations/{target['region']}"
    services = run.projects().locations().services().list(parent=parent).execute()

    # storage.googleapis.com is the GCS front on the same port; the control plane saw run.googleapis.com as Host.
    with httpx.Client(verify=__import__("ssl").create_default_context(cafile=tls["ca_file"])) as client:
        buckets = client.get("https://storage.googleapis.com/storage/v1/b", params={"project": target["project"]})
        seen = client.get("https://run.googleapis.com/_sandbox/requests", params={"server": "control"}).json()
        violations = client.get("https://run.googleapis.com/_sandbox/conformance").json()
    hosts = sorted({entry["headers"].get("host", "") for entry in seen if entry["path"].endswith("/services")})
    print(json.dumps({"services": services, "buckets": buckets.json(), "storage_status": buckets.status_code,
                      "hosts": hosts, "violations": violations}))
finally:
    sandbox.send_signal(signal.SIGTERM)
    try:
        sandbox.wait(timeout=60)
    except subprocess.TimeoutExpired:
        sandbox.kill()
"""


@pytest.mark.slow
@needs_netns
def test_unpatched_googleapiclient_reaches_sandbox_as_run_googleapis_com(tmp_path: Path) -> None:
    script = tmp_path / "client.py"
    script.write_text(CLIENT_SCRIPT)
    state_dir = tmp_path / "sandbox"
    state_dir.mkdir()
    result = subprocess.run(
        netns_command([sys.executable, str(script), str(state_dir), str(SANDBOX_START_S)]),
        capture_output=True,
        text=True,
        timeout=SANDBOX_START_S + 120,
        cwd=REPO,
    )
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr[-6000:]}"
    answer = json.loads(result.stdout.strip().splitlines()[-1])
    assert isinstance(answer["services"].get("services", []), list)
    assert answer["storage_status"] == 200, answer["buckets"]
    assert answer["buckets"]["kind"] == "storage#buckets"
    assert answer["hosts"] == ["run.googleapis.com"]
    assert answer["violations"] == []  # held to Google's discovery schemas, as the session sandbox is
