"""A real-component tier that skips a test under CI fails (tests/conftest.py ``pytest_sessionfinish``): `.ci/run` must
not go green on an engine or worker tier that proved nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_tier(folder: Path, **env: str) -> subprocess.CompletedProcess:
    """pytest on ``folder``'s one passing and one skipped test, with the project's session hook."""
    (folder / "conftest.py").write_text("from tests.conftest import pytest_sessionfinish  # noqa: F401\n")
    (folder / "test_tier.py").write_text(
        "import pytest\n\ndef test_runs():\n    pass\n\n"
        "def test_needs_a_namespace():\n    pytest.skip('no private network namespace here')\n"
    )
    environment = {k: v for k, v in os.environ.items() if k not in ("CI", "TIER_SKIPS_FAIL")}
    environment.update(PYTHONPATH=str(ROOT), **env)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(folder)],
                          cwd=folder, env=environment, capture_output=True, text=True, timeout=300)  # fmt: skip


def test_a_tier_that_skips_fails_under_ci_naming_the_reason(tmp_path: Path):
    result = run_tier(tmp_path, CI="true", TIER_SKIPS_FAIL="1")
    assert result.returncode == pytest.ExitCode.TESTS_FAILED, result.stdout
    assert "this tier skipped 1 test(s), which fails it" in result.stdout
    assert "no private network namespace here" in result.stdout


@pytest.mark.parametrize("env", [{"TIER_SKIPS_FAIL": "1"}, {"CI": "true"}], ids=["outside-ci", "another-tier"])
def test_a_skip_outside_ci_or_in_another_tier_still_passes(tmp_path: Path, env: dict[str, str]):
    result = run_tier(tmp_path, **env)
    assert result.returncode == pytest.ExitCode.OK, result.stdout
    assert "1 passed, 1 skipped" in result.stdout
