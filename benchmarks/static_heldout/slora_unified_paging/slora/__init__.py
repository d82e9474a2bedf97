"""S-LoRA style unified paging: LoRA adapters and KV pages share one pool."""

from slora.config import SLoRAConfig

__all__ = ["SLoRAConfig"]
