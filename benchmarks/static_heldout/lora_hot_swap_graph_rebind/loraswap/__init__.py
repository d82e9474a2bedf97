"""Adapter slots and the hot-swap manager for graph-captured LoRA decode."""

from loraswap.config import LoRAServeConfig
from loraswap.slots import AdapterSlotTable, AdapterWeights
from loraswap.swap import AdapterRegistry, SwapManager

__all__ = ["LoRAServeConfig", "AdapterSlotTable", "AdapterWeights", "AdapterRegistry", "SwapManager"]
