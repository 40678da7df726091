"""What a check finds: a setting, what is wrong with it and the fix, as an error that blocks or a warning that is
reported. Preflight (tasks/checks/preflight.py) and vLLM's own rules (tasks/checks/vllm_rules.py) both speak it."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel


class Finding(BaseModel):
    severity: Literal["error", "warning"]
    setting: str
    message: str
    lesson: int | None = None

    def __str__(self) -> str:
        lesson = f" (lesson {self.lesson})" if self.lesson else ""
        return f"{self.severity}: {self.setting}: {self.message}{lesson}"


class PreflightError(ValueError):
    """The promotion would fail in the cloud; nothing was created or spent."""

    def __init__(self, findings: list[Finding]) -> None:
        self.findings = findings
        errors = [f for f in findings if f.severity == "error"]
        super().__init__("preflight found problems to fix first:\n" + "\n".join(f"- {f}" for f in errors))


def error(setting: str, message: str, lesson: int | None = None) -> Finding:
    return Finding(severity="error", setting=setting, message=message, lesson=lesson)


def warning(setting: str, message: str, lesson: int | None = None) -> Finding:
    return Finding(severity="warning", setting=setting, message=message, lesson=lesson)
