"""Shared test helpers live in tests/support (issue 34): no module under tests/ imports a test module
(``tests.<tier>.test_*``) or a tier's conftest (``tests.<tier>.conftest``).

Importing a test module runs its module-level code in another tier, ties the two files' fixtures and counters
together, and re-collects every ``test_*`` function it imports. A helper two modules need goes to tests/support/; a
fixture several tiers need goes to a plugin there (tests/conftest.py's ``pytest_plugins``).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
# A test module or a conftest inside a tier folder of tests/ (tests/support holds no test modules).
FORBIDDEN = re.compile(r"^tests\.(?!support\.)(\w+\.)+(test_\w*|conftest)$")


def _package(path: Path) -> list[str]:
    """The dotted package a file under tests/ belongs to, e.g. ["tests", "e2e"]."""
    return ["tests", *path.parent.relative_to(TESTS).parts]


def imported_modules(source: str, package: list[str]) -> list[str]:
    """Every module ``source`` imports, by absolute name (``from a import b`` counts both ``a`` and ``a.b``, since
    ``b`` may be a module); relative imports are resolved against ``package``."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            found.append(module)
            found += [f"{module}.{alias.name}" for alias in node.names if alias.name != "*"]
    return found


def forbidden_imports(source: str, package: list[str]) -> list[str]:
    return sorted({m for m in imported_modules(source, package) if FORBIDDEN.match(m)})


def test_no_module_under_tests_imports_a_test_module_or_a_tiers_conftest():
    offences = {
        str(path.relative_to(TESTS.parent)): found
        for path in sorted(TESTS.rglob("*.py"))
        if (found := forbidden_imports(path.read_text(), _package(path)))
    }
    assert offences == {}, "move the shared helper (or fixture) to tests/support/"


@pytest.mark.parametrize(
    ("source", "package", "offence"),
    [
        ("from tests.e2e.test_flows import promote", ["tests", "e2e"], "tests.e2e.test_flows"),
        ("from tests.integration import test_vllm_standin", ["tests", "e2e"], "tests.integration.test_vllm_standin"),
        ("import tests.reliability.test_bad_input", ["tests", "unit"], "tests.reliability.test_bad_input"),
        ("from tests.e2e.conftest import flow_env", ["tests", "engine"], "tests.e2e.conftest"),
        ("from .conftest import dump", ["tests", "worker"], "tests.worker.conftest"),
        ("def f():\n    from ..e2e.test_flows import artifact", ["tests", "e2e"], "tests.e2e.test_flows"),
    ],
)  # fmt: skip
def test_the_check_sees_an_import_of_a_test_module_or_a_conftest(source, package, offence):
    assert forbidden_imports(source, package) == [offence]


def test_the_check_lets_support_modules_through():
    source = "from tests.support.promotion import promote\nfrom tests.support import vllm_standin as standin\n"
    assert forbidden_imports(source, ["tests", "e2e"]) == []
