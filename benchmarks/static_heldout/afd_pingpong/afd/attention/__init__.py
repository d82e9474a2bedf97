from afd.attention.mb_attention import MicroBatchAttention
from afd.attention.microbatch import MicroBatch, split_microbatches

__all__ = ["MicroBatch", "MicroBatchAttention", "split_microbatches"]
