"""Decode serving core: configuration, batches, bucket policy."""

from cgt.config import DEFAULT_PAGE_SIZE, EAGER_DECODE_WORKSPACE_BYTES, ServingConfig
from cgt.batch import DecodeBatch, PaddedView, last_page_lens, make_decode_batch
from cgt.buckets import BucketPolicy, mark_dynamic_dims

__all__ = ["DEFAULT_PAGE_SIZE", "EAGER_DECODE_WORKSPACE_BYTES", "ServingConfig", "DecodeBatch", "PaddedView",
           "last_page_lens", "make_decode_batch", "BucketPolicy", "mark_dynamic_dims"]
