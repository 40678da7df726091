"""The sandbox's TLS face: the control plane and the GCS front again over HTTPS, under Google's own host names.

Why: some clients cannot be pointed at another endpoint. prefect-gcp's Cloud Run worker hard-codes
``https://run.googleapis.com`` and talks to it with httplib2, which trusts only the CA bundle named by
``HTTPLIB2_CA_CERTS``. For such clients the sandbox (``python -m sandbox up --tls-names``) makes a throwaway CA
and a leaf certificate for the Google API host names, and serves its apps on a TLS port (443 by default), routed
by Host header. The names must resolve to 127.0.0.1 for the client: ``python -m sandbox.netns`` runs a command in
a private network namespace whose own /etc/hosts says so (see ``hosts_file_text``).

What this never does: touch the machine's own /etc/hosts or CA store. The CA lives in the sandbox's state
directory and is trusted only by clients that are told about it (``HTTPLIB2_CA_CERTS``, ``SSL_CERT_FILE``,
``REQUESTS_CA_BUNDLE`` or ``verify=``), for as long as that sandbox runs.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

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
# Long enough for a demo or a test session on a slow machine; short, because a new CA is made per sandbox start.
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
    """Write ``data`` to a file that only the owner can read, with no moment at which it is readable by others."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _key_usage(**allowed: bool) -> x509.KeyUsage:
    """A KeyUsage extension allowing only ``allowed`` (every other usage off)."""
    usages = ("digital_signature", "content_commitment", "key_encipherment", "data_encipherment", "key_agreement",
              "key_cert_sign", "crl_sign", "encipher_only", "decipher_only")  # fmt: skip
    return x509.KeyUsage(**{usage: allowed.get(usage, False) for usage in usages})


def make_tls_material(directory: Path, names: Iterable[str] = TLS_NAMES) -> TlsMaterial:
    """Make a new CA and a server certificate it signs for ``names`` and 127.0.0.1; write them to ``directory``.

    Files: ``ca.pem`` (the certificate clients trust), ``ca-key.pem``, ``server.pem`` and ``server-key.pem``
    (keys 0600). Every call makes a new CA, so a CA from an earlier sandbox never vouches for this one.
    """
    names = list(dict.fromkeys(names))
    if not names:
        raise ValueError("make_tls_material needs at least one host name")
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    not_before, not_after = now - BACKDATE, now + VALIDITY

    # EC P-256: generated in milliseconds (an RSA key takes far longer on a loaded machine) and accepted by
    # OpenSSL, httplib2 and httpx alike.
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "hf-cloudrun-pipeline sandbox"),
            x509.NameAttribute(NameOID.COMMON_NAME, f"sandbox throwaway CA {now:%Y-%m-%dT%H:%M:%SZ}"),
        ]
    )
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    # Critical BasicConstraints and KeyUsage, SKI and AKI: what OpenSSL's strict verification (Python 3.13's
    # default context sets VERIFY_X509_STRICT) demands of a CA and of the certificates it signs.
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            _key_usage(key_cert_sign=True, crl_sign=True),
            critical=True,
        )
        .add_extension(ca_ski, critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    leaf_key = ec.generate_private_key(ec.SECP256R1())
    leaf_cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
        .issuer_name(ca_name)
        .public_key(leaf_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.SubjectAlternativeName(
                [*(x509.DNSName(name) for name in names), x509.IPAddress(ipaddress.IPv4Address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            _key_usage(digital_signature=True),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(leaf_key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    material = TlsMaterial(
        ca_file=directory / "ca.pem", cert_file=directory / "server.pem", key_file=directory / "server-key.pem"
    )
    _write_private(directory / "ca-key.pem", _key_pem(ca_key))
    _write_private(material.key_file, _key_pem(leaf_key))
    material.cert_file.write_bytes(leaf_cert.public_bytes(serialization.Encoding.PEM))
    material.ca_file.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    return material


def hosts_file_text(names: Iterable[str] = TLS_NAMES) -> str:
    """An /etc/hosts for a private namespace: the usual localhost lines, then ``127.0.0.1 name`` per name."""
    lines = [
        "# sandbox.tls: the hosts file of one private namespace (python -m sandbox.netns); never the machine's own.",
        "127.0.0.1 localhost",
        "::1 localhost ip6-localhost ip6-loopback",
        *(f"127.0.0.1 {name}" for name in dict.fromkeys(names)),
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
