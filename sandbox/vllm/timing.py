"""How long things take in the field, in simulated seconds, and the clock that turns them into real time.

One place for every duration so they can be tuned together. Sources: seed 000 (compile + CUDA graph capture
"over 5 minutes"; GPU about 19x faster than CPU), seed 001 (GCS FUSE mount: cold start under 20 s for a
small model), seed 004 and FACTS.md (Run:ai streamer and Direct VPC egress load several times faster than
the FUSE mount).
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

GB = 1_000_000_000
GIB = 1024**3

# Before weights: imports, config resolution, platform and distributed init of the engine core.
ENGINE_INIT_S = 15.0
# After weights: memory profiling and KV cache allocation (always, eager or not).
KV_CACHE_PROFILE_S = 4.0
# GPU without --enforce-eager: torch.compile of the model, then CUDA graph capture for batch sizes 1..max.
TORCH_COMPILE_S = 210.0
CUDA_GRAPH_CAPTURE_S = 120.0
# The same torch.compile when vLLM loads its AOT-compiled artefact from VLLM_CACHE_ROOT (sandbox/vllm/compile_cache.py).
# marin-community/marin PR #7615 measured torch.compile 12.8 s cold and 2.3 s with a restored cache: the stand-in keeps
# that ratio, scaled to its own cold figure (210 * 2.3 / 12.8 = 37.73 s). CUDA graph capture is not cached.
TORCH_COMPILE_CACHED_S = TORCH_COMPILE_S * 2.3 / 12.8
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


class SimClock:
    """Simulated seconds to real seconds: ``scale`` real seconds per simulated second.

    With ``publish_to``, the clock also tells its launcher how far the container has got in simulated time, so
    that Cloud Run's startup probe is judged on the container's own progress rather than the host's wall clock
    (sandbox/control/run/instances.py). Simulated time advances only while the container waits (a modelled
    load, compile or hang, and idling once it listens); its real work (the interpreter starting, parsing,
    reading the mounted files) costs none. So a host busy with other work slows the container down in real
    time without pushing its start past a probe window it would meet on an idle one.

    The published line is ``ELAPSED AT WAITING``: simulated seconds spent, the ``time.monotonic()`` (system-wide
    on Linux) of that moment, and how many simulated seconds the container is now waiting (``inf`` once it
    idles). It is written atomically (a rename), so a reader never sees half of it.
    """

    def __init__(self, scale: float, publish_to: Path | None = None) -> None:
        self.scale = scale
        self.elapsed_s = 0.0
        self._publish_to = publish_to
        self._publish(0.0)

    def sleep(self, simulated_s: float) -> None:
        """Wait ``simulated_s`` on the sandbox clock (a signal handler may interrupt it by raising)."""
        if simulated_s > 0:
            self._publish(simulated_s)
            time.sleep(simulated_s * self.scale)
            self.elapsed_s += simulated_s
            self._publish(0.0)

    def idle(self) -> None:
        """From now on the container only waits (it serves requests): its clock runs with the host's; stop
        publishing, since request handling on many threads is not start-up."""
        self._publish(math.inf)
        self._publish_to = None

    def _publish(self, waiting_s: float) -> None:
        if self._publish_to is None:
            return
        partial = self._publish_to.with_name(self._publish_to.name + ".partial")
        partial.write_text(f"{self.elapsed_s!r} {time.monotonic()!r} {waiting_s!r}\n")
        os.replace(partial, self._publish_to)


@dataclass(frozen=True)
class PublishedClock:
    """A container's clock as its SimClock last published it."""

    elapsed_s: float
    at: float  # time.monotonic() of the publication
    waiting_s: float  # inf: the container idles (it listens)

    @classmethod
    def read(cls, path: Path) -> PublishedClock | None:
        """The clock published at ``path``; None before the container has started it."""
        try:
            elapsed, at, waiting = (float(part) for part in path.read_text().split())
        except (FileNotFoundError, ValueError):
            return None
        return cls(elapsed, at, waiting)

    def now(self, scale: float) -> float:
        """Simulated seconds the container has spent by now: its waits advance with the host's clock."""
        return self.elapsed_s + min(max(time.monotonic() - self.at, 0.0) / scale, self.waiting_s)

    @property
    def listening_since(self) -> float | None:
        """The simulated second the container began to idle (its start-up ended), if it has."""
        return self.elapsed_s if math.isinf(self.waiting_s) else None
