"""Speculative decoding with the draft model and the target model on different GPUs."""
from .config import DRAFT_WORKSPACE_BYTES, SplitConfig
from .devices import DevicePair, hand_off
from .pages import PagesOnDevice, PageTableMirror, SpecBatch

__all__ = [
    "DRAFT_WORKSPACE_BYTES",
    "SplitConfig",
    "DevicePair",
    "hand_off",
    "PagesOnDevice",
    "PageTableMirror",
    "SpecBatch",
]
