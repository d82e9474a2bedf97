"""Forward modes, feature flags and the other enums the per-step tables are keyed by."""

from __future__ import annotations

import enum
from typing import Iterable


class ForwardMode(enum.IntEnum):
    IDLE = 0
    DECODE = 1
    EXTEND = 2
    MIXED = 3
    TARGET_VERIFY = 4

    def is_decode_like(self) -> bool:
        return self in (ForwardMode.DECODE, ForwardMode.TARGET_VERIFY)

    def graphable(self) -> bool:
        """Modes the graph runner may record; extend and mixed batches always run eagerly."""
        return self.is_decode_like() or self is ForwardMode.IDLE


class Feature(enum.IntFlag):
    """Engine features switched on per deployment (``TABSERVE_FEATURES=sliding_window,spec_verify``)."""

    NONE = 0
    SLIDING_WINDOW = enum.auto()
    LOGITS_SOFTCAP = enum.auto()
    TRTLLM_DECODE = enum.auto()
    SPEC_VERIFY = enum.auto()
    PAGE_DEFRAG = enum.auto()
    STOP_ON_EOS = enum.auto()

    @classmethod
    def from_names(cls, names: Iterable[str]) -> "Feature":
        flags = cls.NONE
        for name in names:
            flags |= cls[name.strip().upper()]
        return flags


class SamplingFlag(enum.IntFlag):
    """What a batch's sampling parameters need, decided on the host by the runner."""

    NONE = 0
    TOP_P = enum.auto()
    MIXED_GREEDY = enum.auto()


class WorkspaceSize(enum.IntEnum):
    """Byte sizes of the auxiliary workspaces (the main one comes from ``EngineConfig``)."""

    VERIFY = 256 << 20
    DRAFT = 64 << 20


class StaticInput(enum.Enum):
    """Inputs a recorded graph reads from fixed addresses."""

    INPUT_IDS = "input_ids"
    POSITIONS = "positions"
    REQ_POOL_INDICES = "req_pool_indices"
    SEQ_LENS = "seq_lens"
    OUT_CACHE_LOC = "out_cache_loc"
