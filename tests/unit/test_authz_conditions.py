"""Which IAM conditions the sandbox evaluates (sandbox.authz.conditions): Cloud Storage's object-name prefix only."""

from __future__ import annotations

import pytest

from sandbox.authz.conditions import condition_holds

PREFIX = 'resource.name.startsWith("projects/_/buckets/b/objects/compile-cache/")'
OBJECT = 'resource.type == "storage.googleapis.com/Object"'
INSIDE = "projects/_/buckets/b/objects/compile-cache/key/graph.bin"


@pytest.mark.parametrize("expression", [PREFIX, f"{OBJECT} && {PREFIX}", f"({PREFIX}) && ({OBJECT})"])
def test_the_documented_prefix_forms_hold_for_objects_under_the_prefix(expression):
    assert condition_holds({"expression": expression}, INSIDE)
    assert condition_holds({"expression": expression}, "projects/p/buckets/b/objects/compile-cache/x")
    assert not condition_holds({"expression": expression}, "projects/_/buckets/b/objects/models/config.json")
    assert not condition_holds({"expression": expression}, "projects/_/buckets/b")  # objects.list: the bucket


@pytest.mark.parametrize(
    "expression",
    [
        f"{PREFIX} || true",
        'request.time < timestamp("2030-01-01T00:00:00Z")',
        'resource.name.startsWith("projects/_/buckets/b")',
        'resource.type == "storage.googleapis.com/Bucket" && ' + PREFIX,
        "",
    ],
)
def test_any_other_expression_grants_nothing(expression):
    assert not condition_holds({"expression": expression}, INSIDE)
