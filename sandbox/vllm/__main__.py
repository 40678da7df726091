"""``python -m sandbox.vllm ARG...``: run one container instance of a vLLM image."""

import sys

from sandbox.vllm.image_script import run_image_script

if __name__ == "__main__":
    # An image whose entrypoint is its own script hands over before the stand-in's heavier imports: the
    # startup probe's clock is already running.
    run_image_script(sys.argv[1:])
    from sandbox.vllm.entrypoint import main

    sys.exit(main(sys.argv[1:]))
