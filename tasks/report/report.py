"""The promotion report: what a run did, measured, and where traffic stands, as a Prefect markdown artifact."""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Literal

from pydantic import BaseModel, Field

from tasks.checks.findings import Finding, PreflightError
from tasks.deploy.probe import Verification
from tasks.image.builds import BuildAttempt, ImageBuildError, ImageResult
from tasks.quality.verdict import GateResult, table
from tasks.report.cost import CostEstimate
from tasks.watch.canary import RolledBack, StepResult
from tasks.weights.staging import StagingResult

Outcome = Literal["promoted", "unchanged", "failed", "rolled-back", "dry-run"]


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
    candidate_revision: str | None = Field(None, description="The revision this run deployed, if it deployed one.")
    service_url: str | None = None
    candidate_url: str | None = None
    traffic: list[tuple[str, int]] = Field(default_factory=list, description="Where traffic stands at the end.")
    traffic_unknown: str | None = Field(None, description="Why where traffic stands could not be read (e.g. a 403).")
    downtime: str | None = Field(None, description="What a replace rollout cost: how long the service served nothing.")
    verification: Verification | None = None
    quality: GateResult | None = Field(None, description="The quality gate's answers and scores, when it ran.")
    delivery: list[StepResult] = Field(
        default_factory=list, description="Each traffic step (canary, then 100 %) as Cloud Monitoring saw it."
    )
    findings: list[Finding] = Field(default_factory=list)
    notes: list[str] = Field(
        default_factory=list, description="What the run decided and why: a watch skipped, a verdict overridden..."
    )
    cost: CostEstimate | None = None
    steps: list[Step] = Field(default_factory=list)
    build_attempts: list[BuildAttempt] = Field(
        default_factory=list, description="The attempts of a build that failed (a built image carries its own)."
    )

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
        self.outcome = "rolled-back" if isinstance(exc, RolledBack) else "failed"
        if self.outcome == "rolled-back":
            self.serving_revision = None  # the candidate served for a while; what serves now is in the traffic
        if isinstance(exc, PreflightError):
            self.findings += [f for f in exc.findings if f not in self.findings]
            errors = [f.setting for f in self.findings if f.severity == "error"]
            plural = "s" if len(errors) != 1 else ""
            self.reason = f"preflight found {len(errors)} problem{plural} to fix first: {', '.join(errors)}"
        else:
            if isinstance(exc, ImageBuildError):
                self.build_attempts = list(exc.attempts)
            self.reason = str(exc).splitlines()[0][:500] if str(exc) else type(exc).__name__

    def markdown(self) -> str:
        """The report as the UI shows it: the key figures on the first screen, the details below."""
        lines = [f"# {self.model}@{self.revision} on {self.service}: {TITLES[self.outcome]}", ""]
        if self.reason:
            lines += [f"**Reason:** {self.reason}", ""]
        errors = [f for f in self.findings if f.severity == "error"]
        if errors:  # what to fix comes first on a refusal, each finding whole (its message ends with the fix)
            lines += ["**Fix these first:**", "", *[f"- {_md(f)}" for f in errors], ""]
        lines += ["| | |", "|---|---|", *self._key_figures(), ""]
        if self.quality:  # both revisions' answers, beside the scores the verdict rests on
            lines += table(self.quality)
        if self.delivery:  # what the service's own metrics said at each traffic step, beside what the run did
            lines += ["## Traffic steps", "", STEPS_HEADER, "|---|---|---|---|---|---|---|---|---|",
                      *[_step_row(step) for step in self.delivery], ""]  # fmt: skip
        lines += ["## Details", "", "| | |", "|---|---|", *self._details()]
        if self.steps:
            lines += ["", "### Steps", "", "| step | seconds | ok |", "|---|---|---|"]
            lines += [f"| {s.name} | {s.seconds:.2f} | {'yes' if s.ok else 'FAILED'} |" for s in self.steps]
        warnings = [f for f in self.findings if f.severity != "error"]
        if warnings:
            lines += ["", "Preflight warnings:", *[f"- {_md(f)}" for f in warnings]]
        return "\n".join(lines) + "\n"

    # What a user looks for first: did it work, what serves, where, at what cost, and what took the time.
    def _key_figures(self) -> list[str]:
        traffic = ", ".join(f"{rev} {pct} %" for rev, pct in self.traffic) or "no traffic (no serving revision)"
        if self.traffic_unknown:  # not read: saying "no traffic" would be a guess
            traffic = f"unknown: {self.traffic_unknown}"
        serving = f"{self.serving_revision or '-'} (previous: {self.previous_revision or '-'})"
        if self.serving_revision is None and self.traffic:  # a failed run: what served before still serves
            serving = f"{', '.join(rev for rev, _ in self.traffic)} (unchanged by this run)"
            if self.outcome == "rolled-back":
                serving = f"{', '.join(rev for rev, _ in self.traffic)} (again: {self.candidate_revision} rolled back)"
        rows = [
            f"| outcome | {self._outcome()} |",
            f"| serving revision | {serving} |",
            f"| traffic now | {traffic} |",
            f"| service URL | {self.service_url or '-'} |",
        ]
        if self.candidate_url:
            rows.append(f"| candidate URL | {self.candidate_url} |")
        if self.downtime:
            rows.append(f"| downtime | {self.downtime} |")
        rows += [f"| note | {note.replace('|', '/')} |" for note in self.notes]
        # as the service will run, then what this run adds: weights, its job, its watch (tasks/report/cost.py)
        if self.cost:
            weights = self.staging.total_bytes if self.staging else None
            re_promotion = self.previous_revision is not None and self.outcome != "unchanged"
            ran = sum(s.seconds for s in self.steps) or None
            rows += [f"| {label} | {text} |" for label, text in self.cost.rows(weights, re_promotion, ran)]
        if self.steps:
            rows.append(f"| time | {_timing(self.steps)} |")
        links = [f"[Cloud Run revisions]({self.console_url})"] if self.outcome != "dry-run" else []
        if self.build_log_url:
            links.append(f"[Cloud Build log]({self.build_log_url})")
        if links:
            rows.append(f"| console | {' · '.join(links)} |")
        return rows

    def outcome_line(self) -> str:
        """The run's last log line: what it did, what serves where, and what it decided (a worker's log ends here)."""
        traffic = ", ".join(f"{rev} {pct} %" for rev, pct in self.traffic) or "none"
        if self.traffic_unknown:
            traffic = "unknown"
        line = f"{self.service}: {self._outcome()}; traffic {traffic}; URL {self.service_url or '-'}"
        if self.outcome == "promoted":
            line += f"; revision {self.serving_revision} (was {self.previous_revision or 'nothing'})"
        elif self.reason and self.outcome in ("failed", "rolled-back"):
            line += f"; why: {self.reason}"
        return line + "".join(f"; {note}" for note in self.notes)

    def _outcome(self) -> str:
        if self.outcome == "rolled-back":
            breached = next((s.step for s in self.delivery if s.breached), "a step")
            return f"ROLLED BACK: {breached} breached the SLO; traffic is back on the previous revision"
        if self.outcome != "failed":
            return TITLES[self.outcome]
        failed = next((s.name for s in self.steps if not s.ok), None)
        return f"NOT promoted: the {failed} step failed" if failed else "NOT promoted"

    def _details(self) -> list[str]:
        rows = [f"| project / region | {self.project} / {self.region} |", f"| commit | `{self.commit or '-'}` |"]
        if self.staging:
            s = self.staging
            rows += [
                f"| weights | {s.uri} |",
                f"| staged | {s.files_uploaded} files / {s.bytes_uploaded / 1e6:.1f} MB uploaded, {s.files_skipped} "
                f"files / {s.bytes_skipped / 1e6:.1f} MB already there{' (no-op)' if s.noop else ''}, "
                f"{s.mb_per_s} MB/s |",
                f"| Hub retries | {s.rate_limit_waits} rate-limit waits, {s.other_retries} other, "
                f"{s.seconds_waited:.1f} s waited |",
            ]
        if self.image:
            i = self.image
            rows.append(f"| image | `{i.image}` ({i.strategy}{', reused' if i.reused else ''}) |")
        if self.attempts:
            rows.append(f"| build attempts | {_attempts(self.attempts)} |")
        if self.verification:
            v = self.verification
            rows.append(
                f"| verification | healthy after {v.healthy_after_s:.1f} s, serves {', '.join(v.served_models)}, "
                f"reply {v.reply[:60]!r} ({v.usage.get('completion_tokens', 0)} tokens)"
                + (f", from `{v.system_fingerprint}`" if v.system_fingerprint else "")
                + " |"
            )
            if v.requests:
                rows.append(f"| load test | {v.requests} requests: p50 {v.p50_ms} ms, p95 {v.p95_ms} ms, "
                            f"{v.tokens_per_s} tokens/s |")  # fmt: skip
        return rows

    @property
    def console_url(self) -> str:
        """The service's revisions in the Cloud Run console (the page Google's "Manage revisions" doc opens:
        https://cloud.google.com/run/docs/managing/revisions, service -> Revisions tab)."""
        return (
            f"https://console.cloud.google.com/run/detail/{self.region}/{self.service}/revisions?project={self.project}"
        )

    @property
    def build_log_url(self) -> str | None:
        """The console log of the build that made the image (or of the last failed attempt): Cloud Build's own
        ``Build.logUrl``, recorded per attempt. None when nothing was built."""
        last = self.attempts[-1] if self.attempts else None
        return last.log_url if last and last.log_url else None

    @property
    def attempts(self) -> list[BuildAttempt]:
        """Every build attempt of the run, whether the build succeeded or not."""
        return self.image.attempts if self.image else self.build_attempts


TITLES: dict[str, str] = {
    "promoted": "promoted",
    "unchanged": "already serving (no change)",
    "failed": "NOT promoted",
    "rolled-back": "rolled back (breached the SLO under traffic)",
    "dry-run": "dry run (nothing changed)",
}


def _timing(steps: list[Step]) -> str:
    """All steps on one line, the total and the slowest first: where the time went, without scrolling."""
    each = " · ".join(f"{s.name} {s.seconds:.1f} s{'' if s.ok else ' FAILED'}" for s in steps)
    if len(steps) == 1:
        return each
    total = sum(s.seconds for s in steps)
    slowest = max(steps, key=lambda s: s.seconds)
    return f"{total:.1f} s in all, slowest {slowest.name} {slowest.seconds:.1f} s: {each}"


STEPS_HEADER = "| step | traffic | requests | 5xx | stream errors | TTFT p95 | TPOT p95 | request p95 | verdict |"


def _ms(value: float | None) -> str:
    return f"{value:,.0f} ms" if value is not None else "-"


def _step_row(step: StepResult) -> str:
    """One traffic step; TTFT, TPOT and stream errors are "-" when the watch had only Cloud Run's request metrics."""
    failed = f"{step.errors} + {step.throttled} 429" if step.throttled else str(step.errors)
    ratio = f"{failed} ({step.error_ratio:.1%})" if step.error_ratio is not None else "-"
    streams = str(step.stream_errors) if step.stream_errors is not None else "-"
    verdict = step.verdict.upper() if step.breached else step.verdict
    return (f"| {step.step} | {step.split} | {step.requests} | {ratio} | {streams} | {_ms(step.ttft_p95_ms)} | "
            f"{_ms(step.tpot_p95_ms)} | {_ms(step.p95_ms)} | {verdict}: {step.reason} |")  # fmt: skip


def _attempts(attempts: list[BuildAttempt]) -> str:
    """Each ladder rung: its max_jobs, outcome, time and a link to its build log."""
    return "; ".join(
        f"{n}. max_jobs={a.max_jobs}: {a.status} in {a.seconds:.1f} s" + (f" ([log]({a.log_url}))" if a.log_url else "")
        for n, a in enumerate(attempts, 1)
    )


def _md(finding: Finding) -> str:
    """A finding as one markdown list item, its setting in code style and its message (which ends with the fix)
    on one line, so the item is not cut short."""
    lesson = f" (lesson {finding.lesson})" if finding.lesson else ""
    return f"{finding.severity}: `{finding.setting}`: {' '.join(finding.message.splitlines())}{lesson}"
