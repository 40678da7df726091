"""How long things take in the field, in simulated seconds, and the clock that turns them into real time.

One place for every duration so they can be tuned together. Sources: seed 000 (compile + CUDA graph capture
"over 5 minutes"; GPU about 19x faster than CPU), seed 001 (GCS FUSE mount: cold start under 20 s for a
small model), seed 004 and FACTS.md (Run:ai streamer and Direct VPC egress load several times faster than
the FUSE mount).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

GB = 1_000_000_000
GIB = 1024**3

# Before weights: imports, config resolution, platform and distributed init of the engine core.
ENGINE_INIT_S = 15.0
# After weights: memory profiling and KV cache allocation (always, eager or not).
KV_CACHE_PROFILE_S = 4.0
# GPU without --enforce-eager: torch.compile of the model, then CUDA graph capture for batch sizes 1..max.
TORCH_COMPILE_S = 210.0
CUDA_GRAPH_CAPTURE_S = 120.0
# From engine ready to the API server accepting connections (chat template warm-up, routes).
API_SERVER_START_S = 1.0

# Weight read throughput, decimal GB per simulated second, by where the weights come from.
LOAD_GB_PER_S = {
    "local": 2.0,  # the image's own disk
    "gcs_mount": 0.25,  # Cloud Storage volume (GCS FUSE) without Direct VPC egress
    "runai_streamer": 1.0,  # --load-format runai_streamer from gs:// (parallel ranged reads)
}
# *.bin (pickled torch) checkpoints deserialize on the CPU before moving to the device: slower.
PT_LOAD_SLOWDOWN = 2.0

# Decode speed of a small model per request, tokens per simulated second (seed 000: GPU ~19x the CPU).
DECODE_TOKENS_PER_S = {"nvidia-l4": 40.0, "nvidia-rtx-pro-6000": 120.0, "cpu": 2.0}
# Prefill and scheduling overhead per request.
REQUEST_OVERHEAD_S = 0.05

# Repeating warnings of a hung start-up (shm broadcast, c10d rendezvous), as vLLM and torch print them.
SHM_BROADCAST_WARN_PERIOD_S = 60.0
C10D_RETRY_PERIOD_S = 30.0


@dataclass(frozen=True)
class SimClock:
    """Simulated seconds to real seconds: ``scale`` real seconds per simulated second."""

    scale: float

    def sleep(self, simulated_s: float) -> None:
        """Wait ``simulated_s`` on the sandbox clock (a signal handler may interrupt it by raising)."""
        if simulated_s > 0:
            time.sleep(simulated_s * self.scale)
