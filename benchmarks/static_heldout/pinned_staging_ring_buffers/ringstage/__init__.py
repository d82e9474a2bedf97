"""Pinned staging ring: per-step metadata is written on the host, then copied to the device."""

from ringstage.config import RING_DEPTH, RingConfig, default_workspace_bytes
from ringstage.ring import PinnedSlot, StagingRing
from ringstage.host_fill import SeqState, StepInputs, fill_decode_slot, pages_needed, upload_inputs

__all__ = ["RING_DEPTH", "PinnedSlot", "RingConfig", "SeqState", "StagingRing", "StepInputs",
           "default_workspace_bytes", "fill_decode_slot", "pages_needed", "upload_inputs"]
