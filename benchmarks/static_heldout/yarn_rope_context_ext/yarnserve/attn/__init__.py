from yarnserve.attn.chunked import ChunkedPrefillPlanner
from yarnserve.attn.decode import BandDecodeAttention

__all__ = ["BandDecodeAttention", "ChunkedPrefillPlanner"]
