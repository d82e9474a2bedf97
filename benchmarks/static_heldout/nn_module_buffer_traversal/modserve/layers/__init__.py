from modserve.layers.attention import PagedAttention
from modserve.layers.buffers import GraphInputBuffers, HostMirrors
from modserve.layers.rotary import RotaryEmbedding

__all__ = ["GraphInputBuffers", "HostMirrors", "PagedAttention", "RotaryEmbedding"]
