"""The results page's marks (``bench/freshness.py``'s rules 2 and 3): the JSONs measured
before results recorded their commit (``UNVERSIONED``: what ran, and when), and those
whose code changed since but stay on the page (``STALE``: why). Each mark is checked:
a stale one that is fresh again fails until it goes."""

from __future__ import annotations

# Measured before JSONs recorded their commit: what they ran, and when. When one is rerun
# it moves to MEASURED; gpu_check.json will measure ("worker/genpool_worker/model",
# "bench/gpu_check.py", "bench/gpu_check_models.py", "bench/gpu_check_paged.py",
# "bench/gpu_check_residents.py", "bench/gpu_check_host.py", "bench/decode_support.py").
UNVERSIONED: dict[str, str] = {
    "gpu_check.json": (
        "bench/gpu_check.py on one H200, 2026-11-30: the static-slot kernel, which no longer ships"
    ),
}

# Versioned, but the code they measure has changed since: why they stay.
STALE: dict[str, str] = {
    "sim/autoscale_law.json": (
        "recorded at 0acac59; the prefix cache, the KV pool's rework "
        "and the prefill order came after, and the 2.5-hour study "
        "has not been rerun"
    ),
}
