"""Decode context parallelism: the KV of every request is split across the DCP group.

Token ``t`` of a request lives on rank ``(t // interleave) % dcp_size``. Each rank
attends its own shard with every query head (the heads are all-gathered first),
returns the partial output with its log-sum-exp, and the partials of all ranks are
merged with the LSE correction before each rank keeps its own heads again.
"""
from dcp.config import DCPConfig
from dcp.merge import merge_partial_states
from dcp.shard import ShardPageTable, build_local_indptr, local_last_page_len, local_seq_lens

__all__ = [
    "DCPConfig",
    "ShardPageTable",
    "build_local_indptr",
    "local_last_page_len",
    "local_seq_lens",
    "merge_partial_states",
]
