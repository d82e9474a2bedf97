"""Multi-LoRA serving with a fixed number of adapter slots bound into every captured decode graph."""

from loraslots.config import PREFILL_WORKSPACE_BYTES, SlotConfig

__all__ = ["PREFILL_WORKSPACE_BYTES", "SlotConfig"]
