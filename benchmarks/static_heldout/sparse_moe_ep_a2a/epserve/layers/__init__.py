from epserve.layers.attention import MicroBatchAttnBackend, MicroBatchMeta, MLAAttention
from epserve.layers.moe import MoELayer

__all__ = ["MicroBatchAttnBackend", "MicroBatchMeta", "MLAAttention", "MoELayer"]
