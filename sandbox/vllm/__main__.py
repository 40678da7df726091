"""``python -m sandbox.vllm ARG...``: run one container instance of a vLLM image."""

import sys

from sandbox.vllm.entrypoint import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
