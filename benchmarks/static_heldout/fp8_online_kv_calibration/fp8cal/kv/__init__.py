from fp8cal.kv.cache import Fp8PagedKVCache

__all__ = ["Fp8PagedKVCache"]
