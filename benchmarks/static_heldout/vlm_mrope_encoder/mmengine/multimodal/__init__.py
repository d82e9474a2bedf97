from .encoder_cache import EncoderCacheManager, MultimodalEmbeddingBuilder
from .inputs import ImageItem, MultimodalInputs, get_rope_index
from .mrope import MRopePositionsBuilder

__all__ = ["EncoderCacheManager", "ImageItem", "MRopePositionsBuilder", "MultimodalEmbeddingBuilder", "MultimodalInputs", "get_rope_index"]
