"""Pipeline-parallel micro-batch engine: configuration, page tables, micro-batches, workspaces."""
from .config import DECODE_BUCKETS, PAGE_SIZE, PipelineConfig
from .microbatch import MicroBatch, RequestView, SlotBuffers, build_page_table, build_page_table_host, transpose_requests

__all__ = ["DECODE_BUCKETS", "PAGE_SIZE", "MicroBatch", "PipelineConfig", "RequestView", "SlotBuffers",
           "build_page_table", "build_page_table_host", "transpose_requests"]
