"""The real vLLM engine as a container image would carry it: `make engine` builds .engine/ from requirements.lock."""
