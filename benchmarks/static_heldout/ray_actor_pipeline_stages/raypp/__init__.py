"""Pipeline-parallel serving over Ray actors: shared pieces."""

from raypp.config import HEADER_BYTES, PipelineConfig, StageSpec
from raypp.channels import ShmChannel
from raypp.schedule import MicroBatch, MicroBatchScheduler, Request, count_tokens

__all__ = ["HEADER_BYTES", "PipelineConfig", "StageSpec", "ShmChannel", "MicroBatch", "MicroBatchScheduler",
           "Request", "count_tokens"]
