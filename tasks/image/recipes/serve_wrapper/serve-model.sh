#!/bin/sh
# Serve MODEL_PATH (a mounted or gs:// commit folder) under SERVED_MODEL_NAME on Cloud Run's PORT.
# Extra `vllm serve` flags come as container args. vLLM answers /health itself.
set -eu
: "${MODEL_PATH:?set MODEL_PATH to the staged model folder}"
exec vllm serve "$MODEL_PATH" \
  --served-model-name "${SERVED_MODEL_NAME:-$MODEL_PATH}" \
  --host 0.0.0.0 \
  --port "${PORT:-8080}" \
  "$@"
