"""navit-serve: packed native-resolution vision encoder in front of a paged-KV language model."""

from navit.config import DECODE_BUCKETS, IMAGE_TOKEN_ID, MERGE_SIZE, PAGE_SIZE, PATCH_SIZE, VISION_WS_BYTES, VLMConfig

__all__ = ["DECODE_BUCKETS", "IMAGE_TOKEN_ID", "MERGE_SIZE", "PAGE_SIZE", "PATCH_SIZE", "VISION_WS_BYTES", "VLMConfig"]
