from nvfp4kv.quant.kv_pool import QuantKVPool
from nvfp4kv.quant.scale_service import ScaleUpdateService

__all__ = ["QuantKVPool", "ScaleUpdateService"]
