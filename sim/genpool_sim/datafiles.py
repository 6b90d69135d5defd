"""Where the shared data files (Azure trace, measured step times) live.

``GENPOOL_DATA_DIR`` if set; else ``../shared/data`` beside the checkout (the layout
of this project's workspace); else ``/work/shared/data``. Callers fail with a clear
message naming the path when a file is missing.
"""

from __future__ import annotations

import os
from pathlib import Path

AZURE_CONV = "azure_conv_2023.csv"
SPLITWISE_PERF = "splitwise_perf_model.csv"


def data_dir() -> Path:
    candidates = []
    if os.environ.get("GENPOOL_DATA_DIR"):
        candidates.append(Path(os.environ["GENPOOL_DATA_DIR"]))
    candidates.append(Path(__file__).resolve().parents[2].parent / "shared" / "data")
    candidates.append(Path("/work/shared/data"))
    return next((path for path in candidates if path.is_dir()), candidates[0])


def data_file(name: str) -> Path:
    return data_dir() / name
