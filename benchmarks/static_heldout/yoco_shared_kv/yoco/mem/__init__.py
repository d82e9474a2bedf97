from yoco.mem.pools import GlobalKVPool, WindowKVPool

__all__ = ["GlobalKVPool", "WindowKVPool"]
