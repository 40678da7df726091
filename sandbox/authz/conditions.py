"""The IAM Conditions the sandbox evaluates: Cloud Storage's object-name prefix, and nothing else.

Cloud Storage documents one condition for limiting a bucket role to some objects (Cloud Storage docs, "IAM
Conditions" / "Add a conditional role binding", the ``storage_add_bucket_conditional_iam_binding`` sample, whose
example is a ``startsWith`` condition), written over the resource attributes of the checked resource (Cloud IAM
docs, "Resource attributes for IAM Conditions"): ``resource.name`` of an object is
``projects/_/buckets/BUCKET/objects/OBJECT``, ``resource.type`` is ``storage.googleapis.com/Object`` for an object
and ``storage.googleapis.com/Bucket`` for a bucket. So a binding with

    resource.name.startsWith("projects/_/buckets/B/objects/compile-cache/")

(optionally ``&& resource.type == "storage.googleapis.com/Object"``) counts for a check on an object whose name
starts with ``compile-cache/`` and for nothing else. A check on the bucket itself, such as ``storage.objects.list``
(checked on ``projects/_/buckets/B``), never matches: Google's documented caveat that a prefix condition cannot
grant listing, kept here.

Any other expression (other attributes, ``request.time``, ``||``, functions other than ``startsWith``, a prefix not
naming objects) grants nothing here, as before conditions were evaluated at all: the sandbox does not evaluate CEL.
"""

from __future__ import annotations

import re

OBJECT_TYPE = "storage.googleapis.com/Object"
BUCKET_TYPE = "storage.googleapis.com/Bucket"
_STARTS_WITH = re.compile(r'^resource\.name\.startsWith\(\s*"([^"\\]*)"\s*\)$')
_TYPE_IS = re.compile(r'^resource\.type\s*==\s*"([^"\\]*)"$')
_OBJECT_PREFIX = re.compile(r"^projects/_/buckets/[^/]+/objects/")


def resource_type(resource: str) -> str | None:
    """``resource.type`` of a Cloud Storage resource name, None for other resources."""
    parts = resource.split("/")
    if len(parts) >= 4 and parts[0] == "projects" and parts[2] == "buckets":
        return OBJECT_TYPE if len(parts) >= 6 and parts[4] == "objects" else BUCKET_TYPE
    return None


def _unwrapped(text: str) -> str:
    """``text`` without parentheses around all of it."""
    text = text.strip()
    while text.startswith("(") and text.endswith(")") and _balanced(text[1:-1]):
        text = text[1:-1].strip()
    return text


def _balanced(text: str) -> bool:
    depth = 0
    for char in text:
        depth += (char == "(") - (char == ")")
        if depth < 0:
            return False
    return depth == 0


def _terms(expression: str) -> list[str]:
    """The ``&&``-joined terms of ``expression``, each without its enclosing parentheses."""
    return [_unwrapped(term) for term in _unwrapped(expression).split("&&")]


def condition_holds(condition: dict, resource: str) -> bool:
    """Whether a binding's ``condition`` holds for a permission check on ``resource`` (see the module docstring)."""
    expression = str(condition.get("expression") or "")
    if "||" in expression or not expression.strip():
        return False
    prefixes: list[str] = []
    for term in _terms(expression):
        starts = _STARTS_WITH.match(term)
        kind = _TYPE_IS.match(term)
        if starts and _OBJECT_PREFIX.match(starts.group(1)):
            prefixes.append(starts.group(1))
        elif kind and kind.group(1) == OBJECT_TYPE:
            if resource_type(resource) != OBJECT_TYPE:
                return False
        else:
            return False
    # The resource name as Google writes it: the project of a bucket is always "_".
    parts = resource.split("/")
    if len(parts) >= 2 and parts[0] == "projects" and resource_type(resource) is not None:
        resource = "/".join(["projects", "_", *parts[2:]])
    return bool(prefixes) and all(resource.startswith(prefix) for prefix in prefixes)
