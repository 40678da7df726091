"""Inside a Cloud Run job task's own network namespace: wait for its link, configure it, become the task's command.

``python -I -S sandbox/control/run/task_netns.py --ip IP --interface IF --address CIDR --gateway GW -- ARGV...``

Run under ``unshare --net`` by the sandbox (sandbox/control/run/task_network.py), which then moves one end of a veth
pair into this namespace as IF. This shim waits for IF, brings up the namespace's own loopback, gives IF its address
and a default route via the sandbox's end, and execs ARGV: same process, so the attempt's process group, timeout and
SIGTERM-then-SIGKILL stop (job_tasks.py) reach the task's command unchanged.

Why: a Cloud Run job's container has a network of its own: the Prefect server it reports to and Google's APIs are
reached over the network, and 127.0.0.1 is its own loopback, shared only with the containers of its own instance
(Google Cloud blog, "Cloud Run now supports sidecar deployments", 2023-05-23: "All containers within an instance
share the same network namespace and can communicate with each other over localhost:port"), never the machine of
whoever started the job. So a job pointed at a loopback URL fails here as it does on Cloud Run.

Standard library only, run by path with ``-I -S``: the task's environment (PYTHONPATH and the like) is not the
sandbox's, and nothing of the sandbox need be importable for the shim to work.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from collections.abc import Sequence

EXIT_SETUP_FAILED = 125  # as env(1) and unshare(1): the wrapper's own failure, not the command's
EXIT_NOT_FOUND = 127


def _wait_for_link(name: str, deadline_s: float) -> bool:
    """Whether link ``name`` appeared in this namespace before ``deadline_s`` (the sandbox moves it in)."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            socket.if_nametoindex(name)
            return True
        except OSError:
            time.sleep(0.01)
    return False


def _configure(ip: str, interface: str, address: str, gateway: str) -> None:
    """Loopback up, the link's address, the link up, the default route via the sandbox's end (one ``ip -batch``)."""
    commands = (
        "link set lo up\n"
        f"addr add {address} dev {interface}\n"
        f"link set {interface} up\n"
        f"route add default via {gateway} dev {interface}\n"
    )
    subprocess.run([ip, "-batch", "-"], input=commands.encode(), check=True, capture_output=True)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="task_netns.py", description="set up a job task's namespace, exec ARGV")
    parser.add_argument("--ip", required=True, help="iproute2's ip(8), by path (the task's PATH may not hold it)")
    parser.add_argument("--interface", required=True, help="the veth end the sandbox moves into this namespace")
    parser.add_argument("--address", required=True, help="this end's address with its prefix length")
    parser.add_argument("--gateway", required=True, help="the sandbox's end of the link")
    parser.add_argument("--wait-s", type=float, default=60.0, help="how long to wait for the link")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns only on failure (else it becomes the task's command)."""
    args_in = list(sys.argv[1:] if argv is None else argv)
    if "--" not in args_in or args_in.index("--") == len(args_in) - 1:
        print("task_netns: put the task's command after `--`", file=sys.stderr)
        return EXIT_SETUP_FAILED
    split = args_in.index("--")
    args = _parser().parse_args(args_in[:split])
    command = args_in[split + 1 :]
    if not _wait_for_link(args.interface, args.wait_s):
        print(f"task_netns: the task's network link {args.interface} never came ({args.wait_s:g} s)", file=sys.stderr)
        return EXIT_SETUP_FAILED
    try:
        _configure(args.ip, args.interface, args.address, args.gateway)
    except (OSError, subprocess.CalledProcessError) as exc:
        detail = getattr(exc, "stderr", b"") or b""
        print(f"task_netns: configuring the task's network failed: {exc} {detail.decode(errors='replace')}",
              file=sys.stderr)  # fmt: skip
        return EXIT_SETUP_FAILED
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        # What the container runtime reports for a command that is not in the image (job_tasks.py checks first).
        print(f'exec: "{command[0]}": executable file not found in $PATH ({exc})', file=sys.stderr)
        return EXIT_NOT_FOUND
    return EXIT_SETUP_FAILED  # not reached


if __name__ == "__main__":
    sys.exit(main())
