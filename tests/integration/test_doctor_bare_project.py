"""doctor on a project where the caller holds no role, read the way the user reads it: `python -m flows.doctor` in a
child process against the sandbox, its whole terminal output (Prefect's log lines included).

One line per check, each failure shown once, no traceback, no ERROR line, no request URLs, and at the end one block
of grant commands that, run as printed, is enough for the next doctor run to find nothing failed.
"""

from __future__ import annotations

import os
import pickle
import re
import subprocess
import sys
from pathlib import Path

import pytest
from prefect.settings import PREFECT_API_URL

from blocks.target import GcpTarget
from flows.doctor import doctor
from tasks.checks.doctor import DoctorFailed

pytestmark = pytest.mark.prefect
ROOT = Path(__file__).resolve().parents[2]
BARE = "doctor-bare"
# On the sandbox's default project with the l4 preset, what a caller holding nothing fails, and what does not need
# the caller's roles (a profile without metrics or a build; the region offers the L4).
FAILING = [
    "project access",
    "APIs enabled",
    "deployer permissions",
    "doctor permissions",
    "actAs on the runtime service account",
    "CPU quota",
    "Memory quota",
    "GPU quota",
    "subnet",
    "org policy gcp.resourceLocations",
    "org policy run.allowedIngress",
    "org policy run.allowedVPCEgress",
    "org policy iam.allowedPolicyMemberDomains",
    "bucket location",
]
PASSING = ["serving account writes metrics", "GPU offered in region", "build identity"]
# Seeing the project first, then doctor's own read roles, then the deployer's (docs/first-run.md's table order).
GRANTS = [
    "roles/browser",
    "roles/serviceusage.serviceUsageViewer",
    "roles/orgpolicy.policyViewer",
    "roles/run.admin",
    "roles/iam.serviceAccountUser",
    "roles/iam.serviceAccountAdmin",
    "roles/storage.admin",
    "roles/compute.networkAdmin",
    "roles/logging.viewer",
    "roles/monitoring.viewer",
]
MAX_LINES = 60  # 17 rows, the fixes and Prefect's own lines: 48 lines here (73 and 38 KB before the rework)
MAX_BYTES = 8_000  # about 5.3 KB here
GRANT_LINE = re.compile(r'^gcloud projects add-iam-policy-binding sandbox-project --member="\$MEMBER" --role=(\S+)$')


@pytest.fixture
def bare(prefect_api, sb, sandbox_target: GcpTarget):
    """The sandbox target saved as a block, and the caller holding no role on the project inside the test."""
    sandbox_target.save(BARE, overwrite=True)
    with sb.caller_roles([]):
        yield sb


def run_doctor_cli() -> subprocess.CompletedProcess[str]:
    """`python -m flows.doctor --target doctor-bare` as a user runs it, against the session's Prefect server."""
    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()}
    return subprocess.run([sys.executable, "-m", "flows.doctor", "--target", BARE], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=600)  # fmt: skip


def mentions(text: str, name: str) -> int:
    """How often ``name`` occurs as itself (not inside a longer word: "subnet" in "compute.subnetworks.get")."""
    return len(re.findall(rf"(?<![\w.]){re.escape(name)}(?![\w.])", text))


def test_a_bare_project_gets_one_line_per_check_and_one_block_of_grants_at_the_end(bare) -> None:
    done = run_doctor_cli()
    out = done.stdout + done.stderr
    lines = out.splitlines()
    assert done.returncode == 1, out
    assert "Traceback" not in out and "| ERROR" not in out, out
    assert not re.search(r"%[0-9A-Fa-f]{2}", out), out  # no URL-encoded request URL anywhere
    assert len(lines) < MAX_LINES and len(out.encode()) < MAX_BYTES, f"{len(lines)} lines, {len(out.encode())} B"

    rows = [line for line in lines if re.match(r"^(OK|WARN|FAIL) ", line)]
    assert [row.split()[0] for row in rows].count("FAIL") == len(FAILING), rows
    for name in FAILING:  # its row, and nowhere else: not in an exception, not in the final state
        assert mentions(out, name) == 1, (name, out)
        assert any(row.startswith("FAIL") and f"  {name}  " in row for row in rows), (name, rows)
    for name in PASSING:
        assert any(row.startswith("OK") and f"  {name}  " in row for row in rows), (name, rows)
    assert max(len(row) for row in rows) <= 160, [r for r in rows if len(r) > 160]  # a wide terminal's line

    heading = next(i for i, line in enumerate(lines) if line.startswith("Roles to grant on sandbox-project"))
    block, final = lines[heading + 1 : -1], lines[-1]
    assert block[0].startswith('MEMBER=user:"$(gcloud config get-value account)"'), block
    granted = [GRANT_LINE.match(line).group(1) for line in block[1:]]  # every line below is a grant command
    assert granted == GRANTS, block
    assert final.endswith("Finished in state Failed('14 checks failed; 10 roles to grant above')"), final


def test_the_flow_ends_failed_with_one_line_and_the_rows_stay_with_the_caller(bare) -> None:
    state = doctor(target=BARE, return_state=True)
    assert state.is_failed() and state.message == "14 checks failed; 10 roles to grant above"
    with pytest.raises(DoctorFailed) as failed:
        doctor(target=BARE)
    assert [c.name for c in failed.value.checks] == FAILING
    assert failed.value.fixes[-len(GRANTS) :] == [
        f'gcloud projects add-iam-policy-binding sandbox-project --member="$MEMBER" --role={role}' for role in GRANTS
    ]
    # A Prefect result store (results persisted) pickles the state's data: it must come back whole.
    again = pickle.loads(pickle.dumps(failed.value))
    assert str(again) == str(failed.value) and again.checks == failed.value.checks


def test_the_printed_roles_are_enough_for_the_next_doctor_run(bare) -> None:
    bare.set_caller_roles(GRANTS)  # what running the block does
    rows = doctor(target=BARE)
    assert [r for r in rows if r.status == "fail"] == []
