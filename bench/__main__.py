"""`python -m bench`: every benchmark in one command (promotion, readiness, cost, rollback, then staging)."""

from __future__ import annotations

import subprocess
import sys


def main() -> int:
    quick = "--quick" in sys.argv
    status = subprocess.call([sys.executable, "-m", "bench.promotion"])
    status = status or subprocess.call([sys.executable, "-m", "bench.rollback"])
    sizes = "1" if quick else "1,4"
    return status or subprocess.call([sys.executable, "-m", "bench.staging", "--sizes-gib", sizes, "--repeat", "3"])


if __name__ == "__main__":
    sys.exit(main())
