"""Request cancellation: abort flags, dead-row helpers, batches and metrics."""
from .batch import DecodeBatch
from .config import PAD_PAGE, PAD_SLOT, EngineConfig
from .metrics import AbortMetrics
from .registry import AbortRegistry
from .rows import clamp_dead_lengths, mask_rows_

__all__ = ["PAD_PAGE", "PAD_SLOT", "AbortMetrics", "AbortRegistry", "DecodeBatch", "EngineConfig",
           "clamp_dead_lengths", "mask_rows_"]
