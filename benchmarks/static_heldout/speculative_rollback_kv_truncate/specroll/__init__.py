"""Speculative decoding with KV rollback of rejected draft tokens."""

from specroll.config import ModelDims, SpecConfig
from specroll.pages import PagedKVState, PagePool, RowState
from specroll.verify_types import VerifyBatch, VerifyOutput

__all__ = [
    "ModelDims",
    "PagePool",
    "PagedKVState",
    "RowState",
    "SpecConfig",
    "VerifyBatch",
    "VerifyOutput",
]
