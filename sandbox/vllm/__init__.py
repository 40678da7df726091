"""The vLLM stand-in: what a Cloud Run revision instance of a vLLM image does, as a local process.

The sandbox's Cloud Run stand-in launches ``python -m sandbox.vllm ARG...`` once per revision instance, where
``ARG...`` are the container's args. The process behaves like the container: it fails the way the real
image fails (field lessons 1-5, 9, 11), loads weights on the sandbox clock while its port refuses
connections, then serves vLLM's OpenAI-compatible HTTP API on the host port the container port maps to.

Environment contract (set by the Cloud Run stand-in):

- ``SANDBOX_IMAGE_ENTRYPOINT``: ``exec-args`` (Model Garden image: args are the command and must begin
  ``vllm serve``) or ``vllm-serve`` (generic/self-built images: args are appended to ``vllm serve``).
- ``PORT``: the container port Cloud Run announces. ``SANDBOX_PORT_MAP``: JSON {container port: host port};
  a port vLLM binds that is not in the map gets a free host port nobody probes.
- ``SANDBOX_ACCELERATOR`` (``nvidia-l4``, ``nvidia-rtx-pro-6000`` or empty for CPU),
  ``SANDBOX_DRIVER_CUDA`` and ``SANDBOX_IMAGE_CUDA`` (e.g. 12020 = CUDA 12.2; image 0 = CPU build).
- ``SANDBOX_MOUNTS``: JSON list of Cloud Storage volumes {mount_path, bucket, only_dir, read_only, writable},
  read from the GCS emulator at ``STORAGE_EMULATOR_HOST``; ``writable``: the instance's account may create objects
  there (else every write fails, as gcsfuse's do). ``SANDBOX_ROOT``: the container's root filesystem.
- ``SANDBOX_IMAGE_FILES``: JSON {container path: text} of a built image's entrypoint script; an exec-args
  command naming one (or a shell) runs under ``/bin/sh`` with the stand-in as ``vllm`` (image_script.py).
- ``SANDBOX_TIME_SCALE``: real seconds per simulated second. ``SANDBOX_VLLM_FAULTS``: optional JSON faults.
- ``SANDBOX_CLOCK_FILE``: where the stand-in publishes its simulated progress during start-up (timing.SimClock);
  the launcher judges the startup probe's window on it.
- Real vLLM variables that field lessons depend on: ``VLLM_ENABLE_V1_MULTIPROCESSING``, ``VLLM_HOST_IP``,
  ``GLOO_SOCKET_IFNAME``, ``VLLM_CPU_KVCACHE_SPACE``, ``HF_HUB_OFFLINE``, ``VLLM_API_KEY``.
- ``VLLM_CACHE_ROOT`` (default ``/root/.cache/vllm``, the instance's own disk): where a GPU start without
  --enforce-eager keeps its torch.compile cache. On a Cloud Storage volume it persists: the first start compiles
  and saves its AOT artefact there (when writable), later starts with the same compile-relevant config load it
  (compile_cache.py; a directory vLLM cannot create fails the start, as in vLLM). ``VLLM_USE_AOT_COMPILE=0`` or
  ``VLLM_DISABLE_COMPILE_CACHE=1``: compiled every time. ``TORCHINDUCTOR_CACHE_DIR`` is not read (vLLM's AOT path
  overrides it with ``<hash dir>/inductor_cache``).
"""

VLLM_VERSION = "0.33.0"
