"""Async output processing: sampling results cross a bounded queue to a post-processing thread."""

from asyncpipe.config import PipelineConfig
from asyncpipe.pinned import OutputSlot, PinnedOutputRing
from asyncpipe.queue import BoundedStepQueue

__all__ = ["BoundedStepQueue", "OutputSlot", "PinnedOutputRing", "PipelineConfig"]
