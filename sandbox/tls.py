"""The sandbox's TLS face: the control plane and the GCS front again over HTTPS, under Google's own host names.

Why: some clients cannot be pointed at another endpoint. prefect-gcp's Cloud Run worker hard-codes
``https://run.googleapis.com`` and talks to it with httplib2, which trusts only the CA bundle named by
``HTTPLIB2_CA_CERTS``. For such clients the sandbox (``python -m sandbox up --tls-names``) makes a throwaway CA
and a leaf certificate for the Google API host names, and serves its apps on a TLS port (443 by default), routed
by Host header. The names must resolve to the sandbox's address (127.0.0.1, or the private address of
``sandbox.serving.sandbox_host``) for the client: ``python -m sandbox.netns`` runs a command in
a private network namespace whose own /etc/hosts says so (see ``hosts_file_text``).

What this never does: touch the machine's own /etc/hosts or CA store. The CA lives in the sandbox's state
directory and is trusted only by clients that are told about it (``HTTPLIB2_CA_CERTS``, ``SSL_CERT_FILE``,
``REQUESTS_CA_BUNDLE`` or ``verify=``), for as long as that sandbox runs.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trustme

# The Google API host names the TLS face answers for (storage.googleapis.com goes to the GCS front, the rest to
# the control plane; oauth2 is listed so a client's token refresh reaches the sandbox rather than failing DNS).
TLS_NAMES: tuple[str, ...] = (
    "run.googleapis.com",
    "oauth2.googleapis.com",
    "iam.googleapis.com",
    "cloudbuild.googleapis.com",
    "compute.googleapis.com",
    "secretmanager.googleapis.com",
    "artifactregistry.googleapis.com",
    "logging.googleapis.com",
    "monitoring.googleapis.com",
    "serviceusage.googleapis.com",
    "cloudresourcemanager.googleapis.com",
    "orgpolicy.googleapis.com",
    "storage.googleapis.com",
)
STORAGE_NAME = "storage.googleapis.com"
OAUTH2_NAME = "oauth2.googleapis.com"
DEFAULT_TLS_PORT = 443
# The server certificate's validity. Long enough for a demo or a test session on a slow machine; short, because a
# new CA is made per sandbox start.
VALIDITY = datetime.timedelta(days=7)
# Covers a clock that is slightly behind the one that signed.
BACKDATE = datetime.timedelta(hours=1)


@dataclass(frozen=True)
class TlsMaterial:
    """Paths of one sandbox's throwaway CA certificate and its server certificate and key (all PEM)."""

    ca_file: Path
    cert_file: Path
    key_file: Path


def _write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to a file that only the owner can read, with no moment at which it is readable by others
    (trustme's ``Blob.write_to_path`` opens with the default mode, so keys are written here)."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def make_tls_material(directory: Path, names: Iterable[str] = TLS_NAMES, address: str = "127.0.0.1") -> TlsMaterial:
    """Make a new CA and a server certificate it signs for ``names``, 127.0.0.1 and ``address`` (where the face
    listens); write them to ``directory``.

    Files: ``ca.pem`` (the certificate clients trust), ``ca-key.pem``, ``server.pem`` and ``server-key.pem``
    (keys 0600). Every call makes a new CA, so a CA from an earlier sandbox never vouches for this one.
    """
    names = list(dict.fromkeys(names))
    if not names:
        raise ValueError("make_tls_material needs at least one host name")
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)

    # trustme makes EC P-256 keys by default (generated in milliseconds; an RSA key takes far longer on a loaded
    # machine) and the extensions OpenSSL's strict verification demands (Python 3.13's default context sets
    # VERIFY_X509_STRICT): critical BasicConstraints and KeyUsage, SKI and AKI. path_length=0: this CA signs
    # server certificates only. trustme gives its CA certificate a fixed validity (2000 to 3000); the server
    # certificate, which is what clients are served, keeps the short window below.
    ca = trustme.CA(
        path_length=0,
        organization_name="hf-cloudrun-pipeline sandbox",
        organization_unit_name=f"sandbox throwaway CA {now:%Y-%m-%dT%H:%M:%SZ}",
    )
    # The names as DNS SANs in order, then the addresses as IP SANs (trustme reads an address as one).
    leaf = ca.issue_cert(
        *names,
        *dict.fromkeys(("127.0.0.1", address)),
        common_name=names[0],
        organization_name="hf-cloudrun-pipeline sandbox",
        not_before=now - BACKDATE,
        not_after=now + VALIDITY,
    )

    material = TlsMaterial(
        ca_file=directory / "ca.pem", cert_file=directory / "server.pem", key_file=directory / "server-key.pem"
    )
    _write_private(directory / "ca-key.pem", ca.private_key_pem.bytes())
    _write_private(material.key_file, leaf.private_key_pem.bytes())
    leaf.cert_chain_pems[0].write_to_path(material.cert_file)
    ca.cert_pem.write_to_path(material.ca_file)
    return material


def hosts_file_text(names: Iterable[str] = TLS_NAMES, address: str = "127.0.0.1") -> str:
    """An /etc/hosts for a private namespace: the usual localhost lines, then ``ADDRESS name`` per name (``address``:
    where the TLS face listens; a private one is what the namespace's job tasks reach too)."""
    lines = [
        "# sandbox.tls: the hosts file of one private namespace (python -m sandbox.netns); never the machine's own.",
        "127.0.0.1 localhost",
        "::1 localhost ip6-localhost ip6-loopback",
        *(f"{address} {name}" for name in dict.fromkeys(names)),
    ]
    return "\n".join(lines) + "\n"


def _host_of(scope: Mapping[str, Any]) -> str:
    """The request's host name, lowercased, without port (``[::1]:443`` gives ``::1``)."""
    for key, value in scope.get("headers", ()):
        if key == b"host":
            host = value.decode("latin-1").strip().lower()
            if host.startswith("["):
                return host[1 : host.find("]")] if "]" in host else host[1:]
            return host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    return ""


class HostRouter:
    """ASGI app that hands each request to the app registered for its Host header (port ignored), else ``default``.

    One TLS port serves every Google host name, as Google's front ends do; which stand-in answers depends on the
    name the client used (storage.googleapis.com is the GCS front, everything else the control plane).
    """

    def __init__(self, default: Any, routes: Mapping[str, Any] | None = None) -> None:
        self.default = default
        self.routes = {host.lower(): app for host, app in (routes or {}).items()}

    def app_for(self, host: str) -> Any:
        """The app that answers requests for ``host``."""
        return self.routes.get(host.lower(), self.default)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] in ("http", "websocket"):
            await self.app_for(_host_of(scope))(scope, receive, send)
        else:
            await self.default(scope, receive, send)
