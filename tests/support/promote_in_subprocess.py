"""Run one promote-model flow in a child process (to be killed mid-way).

``python -m tests.support.promote_in_subprocess JSON`` where JSON holds the flow's parameters. The child talks
to the Prefect API named in ``PREFECT_API_URL`` (the test session's harness server): it loads the same blocks
and takes the same per-service lock as a run in the test process. It prints ``ready`` once its imports are
done and starts the run when it reads ``go`` on stdin, and prints ``done`` when the flow has returned, so the
parent can import the next child while one works and time its kills over the run itself, without interpreter
start-up and shutdown.
"""

from __future__ import annotations

import json
import sys

from flows.promote import promote_model
from tasks.deploy.probe import VerifyOptions

if __name__ == "__main__":
    params = json.loads(sys.argv[1])
    if params.get("verify") is not None:
        params["verify"] = VerifyOptions.model_validate(params["verify"])
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        sys.exit(0)  # the parent went away: run nothing
    promote_model(**params)
    print("done", flush=True)  # before the interpreter's exit, which takes a while with Prefect
