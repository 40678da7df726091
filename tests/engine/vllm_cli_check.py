"""Run by the engine venv's Python: each argv through vLLM's own ``vllm`` CLI, up to where ``serve`` would start.

Input: a JSON file holding a list of argv lists (the words after ``vllm serve``). Output: a JSON file with one
result per argv: ``{"ok": true}``, or the exit code and what the CLI printed to stderr. Everything runs as
``vllm.entrypoints.cli.main.main()`` does (the subcommands, the env setup, ``ServeSubcommand.validate``); only
the serve command's body, which would load the model and listen, is replaced by a no-op in this process.
"""

import contextlib
import io
import json
import sys

import vllm.entrypoints.cli.serve as serve
from vllm.entrypoints.cli import main as cli

serve.ServeSubcommand.cmd = staticmethod(lambda args: None)


def check(argv: list[str]) -> dict:
    sys.argv = ["vllm", "serve", *argv]
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            cli.main()
    except SystemExit as exc:
        return {"ok": exc.code in (0, None), "code": exc.code, "stderr": err.getvalue()[-2000:]}
    except Exception as exc:  # validation errors are the result, not a crash of this script
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}", "stderr": err.getvalue()[-2000:]}
    return {"ok": True}


if __name__ == "__main__":
    cases_path, results_path = sys.argv[1:3]  # check() sets sys.argv as the CLI reads it
    with open(cases_path) as handle:
        argvs = json.load(handle)
    results = [check(argv) for argv in argvs]
    with open(results_path, "w") as handle:
        json.dump(results, handle)
