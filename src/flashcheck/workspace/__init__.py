"""The workspace sizing oracle: the worst-case FlashInfer float, int and pinned workspace an engine configuration
needs over every batch it can plan, with the witness batch and a recommended size (``flashcheck workspace``).

    from flashcheck.workspace import preset, run_oracle
    result = run_oracle(preset("llama3-8b-prefill"))
    result.required("float"), result.recommended("float")

The analytic part is pure Python (no torch); `flashcheck.workspace.confirm` runs witnesses on a GPU.
"""

from __future__ import annotations

from flashcheck.workspace.config import EngineConfig, WrapperUse, load_toml, preset, preset_names
from flashcheck.workspace.oracle import KindBound, OracleResult, run_oracle

__all__ = [
    "EngineConfig",
    "KindBound",
    "OracleResult",
    "WrapperUse",
    "load_toml",
    "preset",
    "preset_names",
    "run_oracle",
]
