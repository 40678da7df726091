"""What Google's front end checks before a request reaches the API: query parameters and the JSON body.

Both are bound to the method's request message by the JSON/HTTP transcoder; a name it cannot bind is refused
with 400 INVALID_ARGUMENT before the API sees the call.
"""

from __future__ import annotations

import functools
import json
import re
from urllib.parse import parse_qsl

from sandbox import discovery
from sandbox.conformance.schema import Problem, camel, snake, walker

# Google's system parameters, accepted by every REST API ("System parameters",
# https://cloud.google.com/apis/docs/system-parameters). google-api-core's REST transports send
# ``$alt=json;enum-encoding=int`` on every call.
SYSTEM_PARAMETERS = frozenset(
    {
        "$alt",
        "alt",
        "$apiVersion",
        "$.xgafv",
        "$callback",
        "callback",
        "$ct",
        "$fields",
        "fields",
        "$key",
        "key",
        "passwd",
        "password",
        "$prettyPrint",
        "prettyPrint",
        "$quotaUser",
        "quotaUser",
        "$userProject",
        "userProject",
        "$outputDefaults",
        "$unique",
        "access_token",
    }
)


@functools.cache
def _query_names(method: discovery.Method) -> frozenset[str]:
    return frozenset(method.parameters) | frozenset(method.global_parameters) | SYSTEM_PARAMETERS


def query_problems(method: discovery.Method, query_string: str) -> list[str]:
    """Google's message for each query parameter the method's request message cannot bind.

    Names may use proto field names (``update_mask``) or JSON names (``updateMask``); nested fields are dotted
    (``options.requestedPolicyVersion``), as the discovery document lists them.
    """
    names = _query_names(method)
    messages: list[str] = []
    seen: set[str] = set()
    for key, _ in parse_qsl(query_string, keep_blank_values=True):
        if key in seen or key in names or ".".join(camel(part) for part in key.split(".")) in names:
            continue
        seen.add(key)
        messages.append(
            f'Invalid JSON payload received. Unknown name "{key}": Cannot bind query parameter. '
            f"Field '{key}' could not be found in request message."
        )
    return messages


_PREFIX = re.compile(r"^Google[A-Za-z]*?V\d+(?:alpha\d*|beta\d*)?(?=[A-Z])")


@functools.cache
def body_field(method: discovery.Method) -> str:
    """The request field the HTTP body fills, which prefixes every path in an error ("service" for a Cloud Run
    create; "" when the body is the whole request message).

    Discovery documents do not carry the http rule's ``body``; Google's APIs follow one convention, visible in
    the client libraries' http options (e.g. ``google/cloud/run_v2/services/services/transports/rest_base.py``):
    request messages (``...Request``) are sent whole (``body: "*"``), a resource body fills the field named
    after the resource (``body: "service"``), and Compute names it ``<resource>_resource``
    (``body: "network_resource"``).
    """
    schema = method.request_schema or ""
    if schema.endswith("Request") or not schema:
        return ""
    short = snake(_PREFIX.sub("", schema))
    return f"{short}_resource" if method.api == "compute.v1" else short


def body_problems(method: discovery.Method, body: bytes) -> tuple[list[Problem], str | None]:
    """Schema problems of a request body, or a parse error message when the body is not JSON."""
    if not method.request_schema or not body.strip():
        return [], None
    try:
        value = json.loads(body)
    except ValueError:
        return [], "Invalid JSON payload received. Unexpected token."
    if not isinstance(value, dict):
        return [], "Invalid JSON payload received. Expected an object."
    return walker(method.api, "request").check(method.request_schema, value, body_field(method)), None
