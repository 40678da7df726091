"""Google's published API contract, read from the discovery documents google-api-python-client ships.

Every control-plane request is matched to the discovery method the real API would route it to: the method
id (``run.projects.locations.services.create``), its path parameters, and its parameter, request and
response schemas. Validation (``sandbox.conformance``) and permission checks (``sandbox.authz``) both start
from this match, so the sandbox routes exactly what Google routes and nothing it invents.

Path templates follow the discovery rules: ``{name}`` is one segment; ``{+name}`` may span segments and is
constrained by the parameter's ``pattern`` (``^projects/[^/]+/locations/[^/]+/services/[^/]+$``). When
several methods match a path, the one with more literal characters wins (``...services/{s}:getIamPolicy``
over ``...services/{s}``), which is how the real front ends treat custom verbs.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

# The discovery documents of every API the sandbox serves, by the version the product's clients call.
SERVED_APIS: tuple[str, ...] = (
    "run.v2",
    "cloudbuild.v1",
    "compute.v1",
    "iam.v1",
    "secretmanager.v1",
    "artifactregistry.v1",
    "logging.v2",
    "monitoring.v3",
    "storage.v1",
    "serviceusage.v1",
    "serviceusage.v1beta1",  # consumerQuotaMetrics (GPU quota) exist only in v1beta1
    "serviceusage.v1beta1",
    "cloudresourcemanager.v3",
    "orgpolicy.v2",
)

_PARAM = re.compile(r"\{(\+?)([A-Za-z0-9_.$]+)\}")


def document(api: str) -> dict[str, Any]:
    """The discovery document of ``api`` ("run.v2"), as shipped in google-api-python-client."""
    return _load(api)


@functools.cache
def _load(api: str) -> dict[str, Any]:
    folder = resources.files("googleapiclient") / "discovery_cache" / "documents"
    return json.loads((folder / f"{api}.json").read_text())


@dataclass(frozen=True)
class Method:
    """One discovery method with the compiled template that routes to it."""

    api: str
    id: str
    http_method: str
    template: str
    regex: re.Pattern[str]
    literal_chars: int
    doc: dict[str, Any] = field(repr=False, compare=False, hash=False)

    @property
    def request_schema(self) -> str | None:
        return (self.doc.get("request") or {}).get("$ref")

    @property
    def response_schema(self) -> str | None:
        return (self.doc.get("response") or {}).get("$ref")

    @property
    def parameters(self) -> dict[str, dict[str, Any]]:
        return self.doc.get("parameters", {})

    @property
    def schemas(self) -> dict[str, dict[str, Any]]:
        return _load(self.api).get("schemas", {})

    @property
    def global_parameters(self) -> dict[str, dict[str, Any]]:
        return _load(self.api).get("parameters", {})


@dataclass(frozen=True)
class MethodMatch:
    """A request routed to a discovery method: the method and its path parameters (URL-decoded)."""

    method: Method
    path_params: dict[str, str]

    @property
    def id(self) -> str:
        return self.method.id


def _compile(api: str, doc: dict[str, Any], method_doc: dict[str, Any], path: str) -> Method:
    params = method_doc.get("parameters", {})
    regex, literal, pos = ["^"], 0, 0
    for m in _PARAM.finditer(path):
        text = path[pos : m.start()]
        regex.append(re.escape(text))
        literal += len(text)
        reserved, name = m.group(1) == "+", m.group(2)
        pattern = params.get(name, {}).get("pattern")
        if pattern:
            inner = pattern.removeprefix("^").removesuffix("$")
        elif reserved:
            inner = ".+"
        else:
            inner = "[^/]+"
        regex.append(f"(?P<{_group(name)}>{inner})")
        pos = m.end()
    tail = path[pos:]
    regex.append(re.escape(tail) + "$")
    literal += len(tail)
    return Method(
        api=api,
        id=method_doc["id"],
        http_method=method_doc["httpMethod"],
        template=path,
        regex=re.compile("".join(regex)),
        literal_chars=literal,
        doc=method_doc,
    )


def _group(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", name)


def _walk(resources_doc: dict[str, Any]):
    for resource in resources_doc.values():
        yield from resource.get("methods", {}).values()
        yield from _walk(resource.get("resources", {}))


def _method_paths(doc: dict[str, Any], method_doc: dict[str, Any]) -> list[str]:
    """The URL paths (from the host root) a method is served at, media upload paths included."""
    service_path = doc.get("servicePath", "")
    paths = ["/" + service_path + method_doc["path"]]
    for protocol in (method_doc.get("mediaUpload") or {}).get("protocols", {}).values():
        paths.append(protocol["path"])
    if method_doc.get("supportsMediaDownload") and "download" not in paths[0]:
        paths.append("/download/" + service_path + method_doc["path"])
    return paths


@functools.cache
def _methods() -> tuple[Method, ...]:
    found: list[Method] = []
    for api in SERVED_APIS:
        doc = _load(api)
        for method_doc in _walk(doc.get("resources", {})):
            for path in _method_paths(doc, method_doc):
                found.append(_compile(api, doc, method_doc, path))
    return tuple(found)


@functools.cache
def _by_http_method() -> dict[str, tuple[Method, ...]]:
    """Methods grouped by HTTP verb: a request is only ever compared with methods of its own verb."""
    grouped: dict[str, list[Method]] = {}
    for method in _methods():
        grouped.setdefault(method.http_method, []).append(method)
    return {verb: tuple(found) for verb, found in grouped.items()}


@functools.cache
def _candidates(http_method: str, apis: tuple[str, ...] | None) -> tuple[Method, ...]:
    """The methods a request of this verb may route to, within ``apis`` when given (computed once per pair)."""
    return tuple(m for m in _by_http_method().get(http_method, ()) if not apis or m.api in apis)


def methods(api: str | None = None) -> list[Method]:
    """Every routable method (of one API when given)."""
    return [m for m in _methods() if api is None or m.api == api]


def match(http_method: str, path: str, apis: tuple[str, ...] | None = None) -> MethodMatch | None:
    """The discovery method a real Google front end would route ``http_method path`` to, or None.

    ``path`` is the raw (still percent-encoded) URL path; path parameters are returned decoded.
    """
    from urllib.parse import unquote

    best: tuple[Method, re.Match[str]] | None = None
    for method in _candidates(http_method.upper(), tuple(apis) if apis else None):
        found = method.regex.match(path)
        if found and (best is None or method.literal_chars > best[0].literal_chars):
            best = (method, found)
    if best is None:
        return None
    method, found = best
    names = {_group(n): n for _, n in _PARAM.findall(method.template)}
    return MethodMatch(method, {names[g]: unquote(v) for g, v in found.groupdict().items()})
