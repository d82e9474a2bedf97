"""Per-request soft prompts (prompt tuning) served through a static embedding-slot table."""

from .config import SoftPromptConfig, WsTier
from .slot_table import EmbeddingSlotTable
from .adapter_cache import AdapterCache

__all__ = ["SoftPromptConfig", "WsTier", "EmbeddingSlotTable", "AdapterCache"]
