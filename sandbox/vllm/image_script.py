"""An image whose ENTRYPOINT is a shell script (or ``/bin/sh -c``): run it for real, with ``vllm`` on its PATH.

A Dockerfile such as the serve-wrapper recipe's (seed 002) ends ``ENTRYPOINT ["/usr/local/bin/serve-model"]``: the
container runs that script with the container's args, and the script builds the ``vllm serve`` command from
the env (MODEL_PATH, PORT, ...). Rather than guess what a script does, the stand-in writes it into the
container's root and execs ``/bin/sh`` on it, with a ``vllm`` (and ``python``/``python3``) on PATH that are the
stand-in again in exec-args mode. So the script's own mistakes (an unset variable, a hard-coded port) show up
as they would on Cloud Run, and a script that ends ``exec vllm serve ...`` serves.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from sandbox.vllm.instance import ENTRYPOINT_EXEC_ARGS, ContractError, InstanceEnv

SHELLS = ("/bin/sh", "/bin/bash", "sh", "bash")
SHIMS = ("vllm", "python", "python3")
SHIM_DIR = ".sandbox-bin"  # under the container root: not a path the image itself uses


def is_script(argv: Sequence[str], env: InstanceEnv) -> bool:
    """Whether the container's command is a script file of the image, or a shell its ENTRYPOINT runs."""
    return bool(argv) and (argv[0] in env.image_files or (env.image_entrypoint and argv[0] in SHELLS))


def exec_script(argv: Sequence[str], env: InstanceEnv) -> None:
    """Replace this process with ``/bin/sh`` running the image's script (or shell command); never returns."""
    root = env.root
    shims = root / SHIM_DIR
    shims.mkdir(parents=True, exist_ok=True)
    for name in SHIMS:
        shim = shims / name
        # The stand-in again, in exec-args mode: it accepts `vllm serve ...` and `python3 -m vllm...api_server`.
        shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m sandbox.vllm {name} "$@"\n')
        shim.chmod(0o755)
    command = list(argv)
    if command[0] in env.image_files:
        local = root / command[0].lstrip("/")
        local.parent.mkdir(parents=True, exist_ok=True)
        local.write_text(env.image_files[command[0]])
        local.chmod(0o755)
        command = ["/bin/sh", str(local), *command[1:]]
    elif not command[0].startswith("/"):
        command[0] = f"/bin/{command[0]}"
    child_env = dict(os.environ)
    child_env["PATH"] = f"{shims}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}"
    child_env["SANDBOX_IMAGE_ENTRYPOINT"] = "exec-args"
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(command[0], command, child_env)


def run_image_script(argv: Sequence[str]) -> None:
    """Exec the image's script when the container's command is one; return otherwise (the stand-in runs)."""
    if os.environ.get("SANDBOX_IMAGE_ENTRYPOINT") != ENTRYPOINT_EXEC_ARGS or not argv:
        return
    try:
        env = InstanceEnv.from_environ()
    except ContractError:
        return  # the stand-in reports a bad contract itself
    if is_script(argv, env):
        exec_script(argv, env)
