"""One attempt of a Cloud Run job's task: the container's command run as a local process, under the task timeout.

A job's container is not the vLLM stand-in: it runs what the job says (prefect-gcp's worker asks for `prefect
flow-run execute`), for real. An image the sandbox's Cloud Build built FROM a Python base runs in its own Python
environment (sandbox/control/cloudbuild/image_env.py: a venv made from the Dockerfile's install steps), whose ``bin``
leads PATH, in its copy of the image's WORKDIR. Other images (the vLLM stand-ins, prebuilt images the sandbox cannot
unpack) run on this host's interpreter, in a folder of the task's own standing for the WORKDIR. Either way the env is
the one the image, the job and the platform give it (jobs.py builds it) and nothing of the sandbox's own (only locale
and the like pass through: ``PASSTHROUGH_ENV``).

Its stdout and stderr go to two files, the two streams Cloud Logging keeps apart (``run.googleapis.com/stdout`` and
``stderr``). A task that outlives its timeout is killed, process group and all (Cloud Run docs, "Set task timeout
for jobs": "the task is stopped"); SIGTERM first with a grace period, as Cloud Run stops containers.

Where the sandbox serves on a private address (``sandbox.serving.private_address``: inside ``python -m sandbox.netns
--address``) each attempt runs in a network namespace of its own (task_network.py): it reaches the sandbox and the
Prefect server at that address, and its 127.0.0.1 is its own, as a Cloud Run container's is. Elsewhere it runs in
the sandbox's.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from sandbox.control.run.task_network import TaskLink, TaskNetworkError
from sandbox.serving import die_with_parent, private_address, stop_process_group

PASSTHROUGH_ENV = ("LANG", "LC_ALL", "SYSTEMROOT", "TZ")
STOP_GRACE_S = 10.0  # Cloud Run sends SIGTERM, then SIGKILL 10 seconds later (container runtime contract)


@dataclass(frozen=True)
class AttemptSpec:
    argv: list[str]
    env: dict[str, str]
    workdir: Path  # the image's WORKDIR, as a folder of the task's own
    timeout_s: float
    stdout: Path
    stderr: Path
    image_bin: Path | None = None  # the image's Python environment (image_env.py); None: this host's interpreter


@dataclass(frozen=True)
class AttemptResult:
    exit_code: int | None  # None: it never ran (the command was not found) or was stopped by the platform
    timed_out: bool = False
    stopped: bool = False  # cancelled or deleted while it ran
    error: str = ""  # why it could not start

    @property
    def succeeded(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and not self.stopped


class TaskAttempt:
    """Runs one attempt; ``stop()`` from elsewhere ends it early (an execution cancelled or deleted)."""

    def __init__(self, spec: AttemptSpec) -> None:
        self.spec = spec
        self.process: asyncio.subprocess.Process | None = None
        self._stopped = False

    def _env(self) -> dict[str, str]:
        env = {k: os.environ[k] for k in PASSTHROUGH_ENV if k in os.environ}
        image_bin = str(self.spec.image_bin or Path(sys.executable).parent)
        env["PATH"] = os.pathsep.join([image_bin, "/usr/local/bin", "/usr/bin", "/bin"])
        env.update(self.spec.env)
        return env

    def _missing_command(self, env: dict[str, str]) -> bool:
        """Whether the command is not in the image (checked before a namespace shim would exec it)."""
        command = self.spec.argv[0]
        if os.sep in command:
            path = self.spec.workdir / command
            return not (path.is_file() and os.access(path, os.X_OK))
        return shutil.which(command, path=env["PATH"]) is None

    async def run(self) -> AttemptResult:
        self.spec.workdir.mkdir(parents=True, exist_ok=True)
        self.spec.stdout.parent.mkdir(parents=True, exist_ok=True)
        env = self._env()
        # A namespace of the task's own only where the sandbox is on a private address (see the module's doc).
        link = TaskLink.claim() if private_address() else None
        try:
            return await self._run(env, link)
        finally:
            if link is not None:
                await link.release()

    async def _run(self, env: dict[str, str], link: TaskLink | None) -> AttemptResult:
        argv = self.spec.argv
        with self.spec.stdout.open("ab") as out, self.spec.stderr.open("ab") as err:
            try:
                if link is not None:
                    if self._missing_command(env):
                        raise FileNotFoundError(argv[0])
                    try:
                        argv = link.wrap(argv)
                    except (TaskNetworkError, RuntimeError) as exc:
                        err.write(f"sandbox: the task's network: {exc}\n".encode())
                        return AttemptResult(None, error=f"the sandbox could not make the task's network: {exc}")
                self.process = await asyncio.create_subprocess_exec(
                    *argv,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    env=env,
                    cwd=self.spec.workdir,
                    start_new_session=True,
                    preexec_fn=die_with_parent,
                )
            except (FileNotFoundError, PermissionError) as exc:
                # What the container runtime reports for a command that is not in the image.
                message = f'exec: "{self.spec.argv[0]}": executable file not found in $PATH'
                err.write(f"{message}\n".encode())
                return AttemptResult(None, error=f"{message} ({exc.__class__.__name__})")
            if link is not None:
                try:
                    await link.plumb(self.process)
                except TaskNetworkError as exc:
                    err.write(f"sandbox: the task's network: {exc}\n".encode())
                    await self.stop()
                    return AttemptResult(None, error=f"the sandbox could not make the task's network: {exc}")
        try:
            code = await asyncio.wait_for(self.process.wait(), timeout=self.spec.timeout_s)
        except TimeoutError:
            await self.stop()
            return AttemptResult(self.process.returncode, timed_out=True)
        return AttemptResult(code, stopped=self._stopped)

    async def stop(self) -> None:
        """SIGTERM to the container's processes, SIGKILL after the grace period."""
        self._stopped = True
        if self.process is not None:
            await stop_process_group(self.process, STOP_GRACE_S)
