"""Decode with layer weights streamed from host memory into a device LRU of layer slots."""

from wstream.config import FIXED_WS_BYTES, StreamConfig
from wstream.host_weights import HostWeightStore, LayerWeights, split_layer
from wstream.lru import DeviceLayerLRU
from wstream.prefetch import Prefetcher

__all__ = [
    "FIXED_WS_BYTES", "DeviceLayerLRU", "HostWeightStore", "LayerWeights", "Prefetcher", "StreamConfig",
    "split_layer",
]
