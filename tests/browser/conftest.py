"""The real-browser check (`make ui-check`) runs only when asked for, with UI_CHECK=1.

`make test` collects everything under tests/; this folder needs Debian's chromium and the `ui` extra
(Playwright), and replays the whole demo before it opens a page, so the default run must not even import it:
without UI_CHECK=1 its test files are left out of collection (not skipped, so nothing else changes for the suite).
"""

from __future__ import annotations

import os

import pytest

from tests.support.screenshots import SCREENSHOTS

collect_ignore_glob = [] if os.environ.get("UI_CHECK") == "1" else ["test_*.py"]


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if SCREENSHOTS:
        terminalreporter.write_sep("-", "ui-check screenshots")
        for path in SCREENSHOTS:
            terminalreporter.write_line(path)
