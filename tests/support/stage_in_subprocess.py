"""Run one staging in a child process (to be killed mid-way): ``python -m tests.support.stage_in_subprocess JSON``."""

from __future__ import annotations

import json
import sys

from pydantic import SecretStr

from blocks import GcpTarget, ModelSource
from tasks.weights.staging import StagingOptions, stage_model

if __name__ == "__main__":
    spec = json.loads(sys.argv[1])
    stage_model(
        GcpTarget.model_validate(spec["target"]),
        ModelSource.model_validate(spec["source"]),
        SecretStr(spec["token"]) if spec.get("token") else None,
        StagingOptions.model_validate(spec.get("options", {})),
    )
