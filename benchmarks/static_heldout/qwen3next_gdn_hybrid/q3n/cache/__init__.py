from q3n.cache.state_pool import PADDING_SLOT, MambaStatePool

__all__ = ["MambaStatePool", "PADDING_SLOT"]
