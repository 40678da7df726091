"""The promotion report: what a run did, measured, and where traffic stands, as a Prefect markdown artifact."""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Literal

from pydantic import BaseModel, Field

from tasks.builds import ImageResult
from tasks.cost import CostEstimate
from tasks.preflight import Finding, PreflightError
from tasks.probe import Verification
from tasks.staging import StagingResult

Outcome = Literal["promoted", "unchanged", "failed", "dry-run"]


class Step(BaseModel):
    name: str
    seconds: float
    ok: bool


class PromotionReport(BaseModel):
    """Everything the UI shows about one promotion; also the flow's return value."""

    model: str
    revision: str
    service: str
    project: str
    region: str
    outcome: Outcome = "failed"
    reason: str | None = None
    commit: str | None = None
    staging: StagingResult | None = None
    image: ImageResult | None = None
    serving_revision: str | None = None
    previous_revision: str | None = None
    service_url: str | None = None
    candidate_url: str | None = None
    traffic: list[tuple[str, int]] = Field(default_factory=list, description="Where traffic stands at the end.")
    verification: Verification | None = None
    findings: list[Finding] = Field(default_factory=list)
    cost: CostEstimate | None = None
    steps: list[Step] = Field(default_factory=list)

    @contextmanager
    def step(self, name: str):
        """Time one pipeline step; a failing step is recorded before the error propagates."""
        started = time.monotonic()
        try:
            yield
        except BaseException:
            self.steps.append(Step(name=name, seconds=round(time.monotonic() - started, 2), ok=False))
            raise
        self.steps.append(Step(name=name, seconds=round(time.monotonic() - started, 2), ok=True))

    def fail(self, exc: BaseException) -> None:
        """Record why the run failed. A preflight refusal keeps every finding, so the report lists each problem
        with its fix; the exception's own text is only its headline."""
        self.outcome = "failed"
        if isinstance(exc, PreflightError):
            self.findings += [f for f in exc.findings if f not in self.findings]
            errors = [f.setting for f in self.findings if f.severity == "error"]
            plural = "s" if len(errors) != 1 else ""
            self.reason = f"preflight found {len(errors)} problem{plural} to fix first: {', '.join(errors)}"
        else:
            self.reason = str(exc).splitlines()[0][:500] if str(exc) else type(exc).__name__

    def markdown(self) -> str:
        title = {
            "promoted": "promoted",
            "unchanged": "already serving (no change)",
            "failed": "NOT promoted",
            "dry-run": "dry run (nothing changed)",
        }[self.outcome]
        lines = [f"# {self.model}@{self.revision} on {self.service}: {title}", ""]
        if self.reason:
            lines += [f"**Reason:** {self.reason}", ""]
        errors = [f for f in self.findings if f.severity == "error"]
        if errors:  # what to fix comes first on a refusal, each finding whole (its message ends with the fix)
            lines += ["**Fix these first:**", "", *[f"- {_md(f)}" for f in errors], ""]
        traffic = ", ".join(f"{rev} {pct} %" for rev, pct in self.traffic) or "no traffic (no serving revision)"
        lines += [
            "| | |",
            "|---|---|",
            f"| project / region | {self.project} / {self.region} |",
            f"| commit | `{self.commit or '-'}` |",
            f"| traffic now | {traffic} |",
            f"| serving revision | {self.serving_revision or '-'} (previous: {self.previous_revision or '-'}) |",
            f"| service URL | {self.service_url or '-'} |",
            f"| candidate URL | {self.candidate_url or '-'} |",
        ]
        if self.staging:
            s = self.staging
            lines += [
                f"| weights | {s.uri} |",
                f"| staged | {s.files_uploaded} files / {s.bytes_uploaded / 1e6:.1f} MB uploaded, {s.files_skipped} "
                f"files / {s.bytes_skipped / 1e6:.1f} MB already there{' (no-op)' if s.noop else ''}, "
                f"{s.mb_per_s} MB/s |",
                f"| Hub retries | {s.rate_limit_waits} rate-limit waits, {s.other_retries} other, "
                f"{s.seconds_waited:.1f} s waited |",
            ]
        if self.image:
            i = self.image
            attempts = ", ".join(f"max_jobs={a.max_jobs}: {a.status}" for a in i.attempts) or "none"
            lines += [
                f"| image | `{i.image}` ({i.strategy}{', reused' if i.reused else ''}) |",
                f"| build attempts | {attempts} |",
            ]
        if self.verification:
            v = self.verification
            lines.append(
                f"| verification | healthy after {v.healthy_after_s:.1f} s, serves {', '.join(v.served_models)}, "
                f"reply {v.reply[:60]!r} ({v.usage.get('completion_tokens', 0)} tokens) |"
            )
            if v.requests:
                lines.append(f"| load test | {v.requests} requests: p50 {v.p50_ms} ms, p95 {v.p95_ms} ms, "
                             f"{v.tokens_per_s} tokens/s |")  # fmt: skip
        if self.cost:
            c = self.cost
            lines.append(
                f"| cost | ${c.hourly_usd:.2f}/h per instance; ${c.scheduled_monthly_usd:,.0f}/month at "
                f"{c.warm_hours_per_week:.0f} warm h/week vs ${c.always_on_monthly_usd:,.0f} always on |"
            )
        if self.steps:
            lines += ["", "| step | seconds | ok |", "|---|---|---|"]
            lines += [f"| {s.name} | {s.seconds:.2f} | {'yes' if s.ok else 'FAILED'} |" for s in self.steps]
        warnings = [f for f in self.findings if f.severity != "error"]
        if warnings:
            lines += ["", "Preflight warnings:", *[f"- {_md(f)}" for f in warnings]]
        return "\n".join(lines) + "\n"


def _md(finding: Finding) -> str:
    """A finding as one markdown list item, its setting in code style and its message (which ends with the fix)
    on one line, so the item is not cut short."""
    lesson = f" (lesson {finding.lesson})" if finding.lesson else ""
    return f"{finding.severity}: `{finding.setting}`: {' '.join(finding.message.splitlines())}{lesson}"
