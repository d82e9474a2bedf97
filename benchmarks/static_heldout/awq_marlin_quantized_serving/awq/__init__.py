"""AWQ checkpoint loading and Marlin GEMM helpers."""
from awq.config import DECODE_WORKSPACE_BYTES, AWQServeConfig, QuantLayerMeta
from awq.loader import AWQWeightLoader, MarlinWeights
from awq.marlin import GemmConfig, MarlinAutotuner, MarlinLinear
from awq.paging import last_page_lens, pages_for

__all__ = [
    "DECODE_WORKSPACE_BYTES",
    "AWQServeConfig",
    "QuantLayerMeta",
    "AWQWeightLoader",
    "MarlinWeights",
    "GemmConfig",
    "MarlinAutotuner",
    "MarlinLinear",
    "last_page_lens",
    "pages_for",
]
