from tforge.utils.memory import alloc_buffer

__all__ = ["alloc_buffer"]
