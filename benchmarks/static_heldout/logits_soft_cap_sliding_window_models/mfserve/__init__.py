"""Multi-family serving: the families, their limits and host-side paging helpers."""

from mfserve.config import ServeConfig, WsTier
from mfserve.families import FAMILY_SPECS, FamilySpec
from mfserve.paging import RowState, pad_indptr, pad_last_page_len, window_kv_indptr

__all__ = ["FAMILY_SPECS", "FamilySpec", "RowState", "ServeConfig", "WsTier", "pad_indptr",
           "pad_last_page_len", "window_kv_indptr"]
