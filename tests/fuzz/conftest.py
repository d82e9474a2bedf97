"""Fuzz tests: one torch thread (tiny CPU ops; thread-pool contention costs 100x on a busy 2-core host), and the
faulty targets of tests/quality importable by name."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

torch.set_num_threads(1)
QUALITY = str(Path(__file__).resolve().parent.parent / "quality")
if QUALITY not in sys.path:
    sys.path.insert(0, QUALITY)

# pytester's inline runs restore sys.modules afterwards: let the outer process do torch's lazy imports of a dispatch
# mode once, so that no inner run imports (and registers) torch's operator libraries a second time
from flashcheck.runtime.checker import Checker  # noqa: E402

with Checker(layers=["dispatch"]):
    pass
