"""Image-keyed KV prefix cache: hashing, page pool, cached entries and eviction."""
from vlcache.hashing import NULL_IMAGE_HASH, image_hash
from vlcache.image_cache import CachedImage, ImageKVCache
from vlcache.pool import PagePool

__all__ = ["NULL_IMAGE_HASH", "image_hash", "CachedImage", "ImageKVCache", "PagePool"]
