"""Start a sandbox as a child process and talk to its admin API: what test fixtures and the demo use."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from sandbox.runtime import INFO_FILE


@dataclass
class _AddedFault:
    """A rule this handle added: as the sandbox stored it, why it may stay idle, and what it fired once removed."""

    rule: dict
    may_not_fire: str | None
    fired: int | None = None  # None while the rule is still in the sandbox (its count is read there)


class SandboxHandle:
    """A running sandbox (``python -m sandbox up``) and a client for its ``/_sandbox`` admin API."""

    def __init__(self, info: dict, process: subprocess.Popen | None = None) -> None:
        self.info = info
        self.process = process
        self.admin = httpx.Client(base_url=f"{info['control_url']}/_sandbox", timeout=30)
        self._added_faults: dict[int, _AddedFault] = {}  # by rule id, until take_unfired_faults

    @classmethod
    def start(cls, state_dir: Path, *args: str, timeout_s: float = 180.0) -> SandboxHandle:
        """Launch ``python -m sandbox up --state-dir state_dir`` and wait until it has written its URLs."""
        state_dir.mkdir(parents=True, exist_ok=True)
        info_path = state_dir / INFO_FILE
        info_path.unlink(missing_ok=True)
        log = (state_dir / "sandbox.log").open("ab")
        process = subprocess.Popen(
            [sys.executable, "-m", "sandbox", "up", "--state-dir", str(state_dir), "--quiet", *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        log.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if process.poll() is not None:
                tail = (state_dir / "sandbox.log").read_text(errors="replace")[-4000:]
                raise RuntimeError(f"sandbox exited with {process.returncode}:\n{tail}")
            if info_path.exists():
                info = json.loads(info_path.read_text())
                if info.get("pid") == process.pid:
                    return cls(info, process)
            time.sleep(0.02)
        process.kill()
        raise RuntimeError(f"sandbox did not start within {timeout_s} s; see {state_dir / 'sandbox.log'}")

    @classmethod
    def attach(cls, state_dir: Path) -> SandboxHandle:
        """Use a sandbox that someone else started (``python -m sandbox up`` in another terminal)."""
        return cls(json.loads((state_dir / INFO_FILE).read_text()))

    # URLs and ready-made settings -------------------------------------------------------------------------
    @property
    def target(self) -> dict[str, Any]:
        """Keyword arguments for a GcpTarget that points at this sandbox."""
        return dict(self.info["target"])

    @property
    def hub_url(self) -> str:
        return self.info["hub_url"]

    @property
    def hub_token(self) -> str:
        return self.info["hub"]["token"]

    @property
    def gcs_url(self) -> str:
        return self.info["gcs_url"]

    @property
    def control_url(self) -> str:
        return self.info["control_url"]

    # Admin API ------------------------------------------------------------------------------------------
    def _ok(self, response: httpx.Response) -> Any:
        response.raise_for_status()
        return response.json()

    def add_fault(self, server: str, *, may_not_fire: str | None = None, **rule: Any) -> dict:
        """Inject a fault (see ``sandbox.faults.FaultRule``); returns the stored rule with its id.

        The handle remembers the rule until ``take_unfired_faults``: a fault that never fired tested nothing, so the
        tests' check fails a test whose rule stayed idle. ``may_not_fire`` says why this one legitimately may (a
        guard against a race the test usually wins, say); the reason stays with the test that needs it.
        """
        response = self.admin.post("/faults", json={"server": server, **rule})
        if response.status_code == 400:  # a misspelt key or server: say which, not just "400 Bad Request"
            message = f"the sandbox refused fault rule {rule | {'server': server}}: {response.text}"
            raise httpx.HTTPStatusError(message, request=response.request, response=response)
        added = self._ok(response)
        self._added_faults[added["id"]] = _AddedFault(added, may_not_fire)
        return added

    def faults(self) -> list[dict]:
        return self._ok(self.admin.get("/faults"))

    def clear_faults(self, server: str | None = None) -> None:
        """Remove the rules (of ``server``, else all); what the remembered ones fired is kept for the check."""
        removed = self._ok(self.admin.delete("/faults", params={"server": server} if server else None))
        for rule in removed:
            if (added := self._added_faults.get(rule["id"])) is not None:
                added.fired = rule["fired"]

    def take_unfired_faults(self) -> list[dict]:
        """The rules added through this handle since the last call that never fired and were not allowed not to;
        the handle then forgets every rule it remembered (the check runs once per test)."""
        added, self._added_faults = self._added_faults, {}
        if any(f.fired is None for f in added.values()):
            current = {r["id"]: r["fired"] for r in self.faults()}
            for rule_id, fault in added.items():
                if fault.fired is None:
                    fault.fired = current.get(rule_id, 0)  # removed behind this handle's back: nothing to show
        return [f.rule for f in added.values() if f.fired == 0 and f.may_not_fire is None]

    def forget_faults(self) -> None:
        """Drop the remembered rules unchecked: a test that failed already says what went wrong."""
        self._added_faults = {}

    def requests(self, server: str | None = None, since: int = 0) -> list[dict]:
        params: dict[str, Any] = {"since": since}
        if server:
            params["server"] = server
        return self._ok(self.admin.get("/requests", params=params))

    def last_request_seq(self) -> int:
        entries = self.requests()
        return entries[-1]["seq"] if entries else 0

    def conformance_violations(self) -> list[dict]:
        """Responses the sandbox sent that break Google's discovery schemas (``sandbox.conformance``)."""
        return self._ok(self.admin.get("/conformance"))

    def configure(self, **settings: Any) -> dict:
        """Change time scale or quotas of the running sandbox."""
        return self._ok(self.admin.post("/config", json=settings))

    def settle_grants(self) -> int:
        """Every role granted so far counts now (its propagation over); later grants still wait."""
        return self._ok(self.admin.post("/grants/settle"))["settled"]

    def hub(self, method: str, path: str, **kwargs: Any) -> Any:
        """Call the Hub stand-in's admin API (``/_sandbox/hub/...``): create repos, commits, grants."""
        return self._ok(self.admin.request(method, f"/hub{path}", **kwargs))

    def run(self, method: str, path: str, **kwargs: Any) -> Any:
        """Call the Cloud Run stand-in's admin API (``/_sandbox/run/...``): instance faults, logs."""
        return self._ok(self.admin.request(method, f"/run{path}", **kwargs))

    def set_caller_roles(self, roles: list[str], member: str | None = None) -> list[str]:
        """Replace the caller's (or ``member``'s) roles in the project IAM policy; returns the roles it held."""
        before = self._ok(self.admin.get("/resourcemanager/policy"))
        who = member or before["caller"]
        held = sorted({b["role"] for b in before["policy"].get("bindings", []) if who in b.get("members", [])})
        self._ok(self.admin.post("/resourcemanager/caller-roles", json={"roles": roles, "member": who}))
        return held

    @contextlib.contextmanager
    def caller_roles(self, roles: list[str]) -> Iterator[None]:
        """The caller holds exactly ``roles`` on the project inside the block; its previous roles come back after."""
        previous = self.set_caller_roles(roles)
        try:
            yield
        finally:
            self.set_caller_roles(previous)

    def stop(self) -> None:
        self.admin.close()
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=60)  # it stops every instance it runs; a busy host makes that slow
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def __enter__(self) -> SandboxHandle:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()
