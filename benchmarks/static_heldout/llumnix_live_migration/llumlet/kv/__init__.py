from llumlet.kv.block_table import BlockTable

__all__ = ["BlockTable"]
