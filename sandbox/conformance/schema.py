"""Walk a JSON value against a discovery schema: unknown fields at any depth and enum values outside the schema.

The walk follows the discovery document exactly: ``$ref`` to a named schema, ``items`` of arrays and
``additionalProperties`` of maps; ``Any`` values (``{"@type": ...}``) are checked against the schema their type
URL names when one of the served documents has it (a Cloud Run operation's ``response`` is a
``GoogleCloudRunV2Service``). Paths in problems use Google's format: proto field names joined by dots, array
elements as ``[i]`` and map entries as ``[i].value`` (a map is a repeated entry message on the wire), e.g.
``service.template.containers[0]`` or ``tools[0].function_declarations[63].parameters.properties[9].value``
(Gemini API errors quoted in zed-industries/zed#62539, google-gemini/gemini-cli#13972).
"""

from __future__ import annotations

import functools
import importlib
import json
import re
from dataclasses import dataclass
from typing import Any, Literal

from sandbox import discovery

# The proto package and the Python module (google-cloud-*) that holds it, per served API. The module is only
# imported to name an enum type in an error message, exactly as Google names it.
PROTO_PACKAGES: dict[str, tuple[str, str | None]] = {
    "run.v2": ("google.cloud.run.v2", "google.cloud.run_v2"),
    "cloudbuild.v1": ("google.devtools.cloudbuild.v1", "google.cloud.devtools.cloudbuild_v1"),
    "artifactregistry.v1": ("google.devtools.artifactregistry.v1", "google.cloud.artifactregistry_v1"),
    "secretmanager.v1": ("google.cloud.secretmanager.v1", "google.cloud.secretmanager_v1"),
    "iam.v1": ("google.iam.admin.v1", None),
    "logging.v2": ("google.logging.v2", None),
    "compute.v1": ("google.cloud.compute.v1", "google.cloud.compute_v1"),
    "serviceusage.v1": ("google.api.serviceusage.v1", "google.cloud.service_usage_v1"),
    "serviceusage.v1beta1": ("google.api.serviceusage.v1beta1", None),
    "cloudresourcemanager.v3": ("google.cloud.resourcemanager.v3", "google.cloud.resourcemanager_v3"),
    "orgpolicy.v2": ("google.cloud.orgpolicy.v2", "google.cloud.orgpolicy_v2"),
    "storage.v1": ("google.storage.v1", None),
}

Side = Literal["request", "response"]


@dataclass(frozen=True)
class Problem:
    """One place where a value breaks its schema.

    ``kind`` "unknown": ``name`` is not a field of the message at ``path``; "enum": the value at ``path``
    (``name``, as JSON) is not one of its enum's values, ``type_url`` names the enum; "value": the value has the
    wrong JSON type for its field, ``type_url`` names the field's type (``TYPE_STRING``).
    """

    kind: Literal["unknown", "enum", "value"]
    path: str
    name: str
    type_url: str = ""

    @property
    def message(self) -> str:
        """Google's wording (ESF JSON transcoding) for this problem."""
        if self.kind == "unknown":
            where = f" at '{self.path}'" if self.path else ""
            return f'Invalid JSON payload received. Unknown name "{self.name}"{where}: Cannot find field.'
        return f"Invalid value at '{self.path}' ({self.type_url}), {self.name}"


@functools.lru_cache(maxsize=8192)
def snake(name: str) -> str:
    """The proto field name behind a JSON name (``maxInstanceCount`` -> ``max_instance_count``)."""
    return re.sub(r"(?<!^)([A-Z])", r"_\1", name).lower()


def camel(name: str) -> str:
    """The JSON name of a proto field name (``max_instance_count`` -> ``maxInstanceCount``)."""
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def _join(path: str, field: str) -> str:
    return f"{path}.{field}" if path else field


class Walker:
    """Checks values of one API's schemas. Request side accepts proto field names too (``max_instance_count``),
    as Google's JSON parser does; response side must use the JSON names the real API sends.
    """

    def __init__(self, api: str, side: Side) -> None:
        self.api = api
        self.side = side
        self.schemas: dict[str, dict[str, Any]] = discovery.document(api).get("schemas", {})

    def check(self, schema: str | dict[str, Any], value: Any, path: str = "") -> list[Problem]:
        problems: list[Problem] = []
        node = {"$ref": schema} if isinstance(schema, str) else schema
        self._walk(node, value, path, problems, owner=None, field=None)
        return problems

    # -------------------------------------------------------------------------------------------------
    def _resolve(self, node: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
        ref = node.get("$ref")
        if ref is None:
            return node, None
        return self.schemas.get(ref, {}), ref

    def _walk(
        self,
        node: dict[str, Any],
        value: Any,
        path: str,
        problems: list[Problem],
        owner: str | None,
        field: str | None,
    ) -> None:
        node, ref = self._resolve(node)
        kind = node.get("type")
        if kind == "array":
            if isinstance(value, list):
                for i, item in enumerate(value):
                    self._walk(node.get("items", {}), item, f"{path}[{i}]", problems, owner, field)
            return
        if kind == "object" or "properties" in node:
            if not isinstance(value, dict):
                return
            if "properties" in node:
                self._message(node, ref, value, path, problems)
                return
            extra = node.get("additionalProperties")
            if extra is None:
                for key in value:
                    problems.append(Problem("unknown", path, key))
                return
            if extra.get("type") == "any":
                self._any(value, path, problems)
                return
            for i, item in enumerate(value.values()):
                self._walk(extra, item, f"{path}[{i}].value", problems, owner, field)
            return
        if "enum" in node:
            self._enum(node, value, path, problems, owner, field)
        elif kind in _SCALARS and value is not None and not _scalar_ok(kind, node.get("format"), value):
            shown = json.dumps(value)[:80]
            problems.append(Problem("value", path, shown, _scalar_type(kind, node.get("format"))))

    def _message(self, node: dict[str, Any], ref: str | None, value: dict, path: str, problems: list[Problem]) -> None:
        props: dict[str, Any] = node["properties"]
        for key, item in value.items():
            prop = key if key in props else None
            if prop is None and self.side == "request" and "_" in key and camel(key) in props:
                prop = camel(key)
            if prop is None:
                problems.append(Problem("unknown", path, key))
                continue
            self._walk(props[prop], item, _join(path, snake(prop)), problems, ref, prop)

    def _any(self, value: dict, path: str, problems: list[Problem]) -> None:
        type_url = value.get("@type")
        if not isinstance(type_url, str):
            return  # a Struct, or an Any without a type: nothing to check against
        found = schema_for_type_url(type_url)
        if found is None:
            return
        api, schema = found
        content = {k: v for k, v in value.items() if k != "@type"}
        problems.extend(walker(api, self.side).check(schema, content, path))

    def _enum(
        self,
        node: dict[str, Any],
        value: Any,
        path: str,
        problems: list[Problem],
        owner: str | None,
        field: str | None,
    ) -> None:
        values: list[str] = node["enum"]
        # google-api-core's REST transports ask for ``$alt=json;enum-encoding=int`` and send enums as numbers.
        if isinstance(value, bool):
            bad = True
        elif isinstance(value, int):
            bad = value not in enum_numbers(self.api, owner, field, len(values))
        elif isinstance(value, str):
            bad = value not in values
        else:
            bad = value is not None
        if bad:
            shown = f'"{value}"' if isinstance(value, str) else str(value)
            problems.append(Problem("enum", path, shown, enum_type_url(self.api, owner, field)))


# Proto3 JSON parsing (https://protobuf.dev/programming-guides/json/): 32/64-bit integers and floats take a JSON
# number or a string holding one, bools true/false (or those two strings), strings (and bytes, Timestamp,
# Duration, FieldMask) only strings. A value of the wrong JSON type is refused as
# "Invalid value at 'path' (TYPE_STRING), 0" (Gemini API errors quoted in google-gemini/gemini-cli#4415).
_SCALARS = frozenset({"string", "integer", "number", "boolean"})
_NUMERIC_FORMATS = frozenset({"int64", "uint64", "int32", "uint32", "double", "float"})
_WELL_KNOWN = {
    "google-datetime": "type.googleapis.com/google.protobuf.Timestamp",
    "google-duration": "type.googleapis.com/google.protobuf.Duration",
    "google-fieldmask": "type.googleapis.com/google.protobuf.FieldMask",
}
_NUMBER = re.compile(r"^-?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?$")


def _scalar_ok(kind: str, fmt: str | None, value: Any) -> bool:
    if kind == "boolean":
        return isinstance(value, bool) or value in ("true", "false")  # the parser also takes the two strings
    numeric = kind in ("integer", "number") or fmt in _NUMERIC_FORMATS
    if not numeric:
        return isinstance(value, str)
    if isinstance(value, bool):
        return False
    integral = kind == "integer" or fmt in ("int64", "uint64", "int32", "uint32")
    if isinstance(value, int):
        return True
    if isinstance(value, float):
        return not integral or value.is_integer()
    if isinstance(value, str):
        if not integral and value in ("NaN", "Infinity", "-Infinity"):
            return True
        return bool(_NUMBER.match(value)) and (not integral or float(value).is_integer())
    return False


def _scalar_type(kind: str, fmt: str | None) -> str:
    if fmt in _WELL_KNOWN:
        return _WELL_KNOWN[fmt]
    if fmt in _NUMERIC_FORMATS:
        return f"TYPE_{fmt.upper()}"
    return {"boolean": "TYPE_BOOL", "integer": "TYPE_INT32", "number": "TYPE_DOUBLE"}.get(
        kind, "TYPE_BYTES" if fmt == "byte" else "TYPE_STRING"
    )


@functools.cache
def walker(api: str, side: Side) -> Walker:
    """The (stateless) walker of one API's schemas, built once."""
    return Walker(api, side)


@functools.cache
def _type_index() -> dict[str, tuple[str, str]]:
    """Proto full name -> (api, discovery schema) for every schema a served document has."""
    index: dict[str, tuple[str, str]] = {}
    for api in discovery.SERVED_APIS:
        package, _ = PROTO_PACKAGES.get(api, ("", None))
        if not package:
            continue
        prefix = "".join(part[:1].upper() + part[1:] for part in package.split("."))
        for name in discovery.document(api).get("schemas", {}):
            short = name.removeprefix(prefix) if name.startswith(prefix) and name != prefix else name
            index.setdefault(f"{package}.{short}", (api, name))
    return index


def schema_for_type_url(type_url: str) -> tuple[str, str] | None:
    """The (api, schema) a ``type.googleapis.com/...`` URL names, when a served document has that schema."""
    return _type_index().get(type_url.rpartition("/")[2])


@functools.cache
def _enum_descriptor(api: str, schema: str | None, field: str | None) -> Any:
    """The enum's proto descriptor, from the installed client library (google-cloud-*), or None."""
    package, module = PROTO_PACKAGES.get(api, ("", None))
    if not (module and schema and field):
        return None
    prefix = "".join(part[:1].upper() + part[1:] for part in package.split("."))
    try:
        importlib.import_module(module)
        from google.protobuf import descriptor_pool

        message = descriptor_pool.Default().FindMessageTypeByName(f"{package}.{schema.removeprefix(prefix)}")
    except (ImportError, KeyError):
        return None
    for proto_field in message.fields:
        if proto_field.json_name == field and proto_field.enum_type is not None:
            return proto_field.enum_type
    return None


@functools.cache
def enum_numbers(api: str, schema: str | None, field: str | None, count: int) -> frozenset[int]:
    """The numbers an enum field accepts: the proto's own (Cloud Build's MachineType skips 3, 4 and 8-10) when the
    client library is installed, else 0..count-1 in the discovery document's order."""
    found = _enum_descriptor(api, schema, field)
    if found is None:
        return frozenset(range(count))
    return frozenset(v.number for v in found.values)


@functools.cache
def enum_type_url(api: str, schema: str | None, field: str | None) -> str:
    """``type.googleapis.com/google.cloud.run.v2.IngressTraffic``: the enum's full proto name, read from the
    client library's descriptors when installed, else derived from the schema and field names."""
    found = _enum_descriptor(api, schema, field)
    if found is not None:
        return f"type.googleapis.com/{found.full_name}"
    package, _ = PROTO_PACKAGES.get(api, ("", None))
    prefix = "".join(part[:1].upper() + part[1:] for part in package.split("."))
    short = (schema or "").removeprefix(prefix)
    return f"type.googleapis.com/{package}.{short}.{(field or '')[:1].upper()}{(field or '')[1:]}"
