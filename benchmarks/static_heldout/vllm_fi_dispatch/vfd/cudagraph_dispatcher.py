"""Chooses, per step, which captured graph (if any) a batch replays."""

from __future__ import annotations

import logging
from typing import Optional

from vfd.config import CUDAGraphMode, VllmConfig
from vfd.forward_context import BatchDescriptor

logger = logging.getLogger(__name__)


class CudagraphDispatcher:
    def __init__(self, vllm_config: VllmConfig):
        self.vllm_config = vllm_config
        self.compilation_config = vllm_config.compilation_config
        self.cudagraph_mode = self.compilation_config.cudagraph_mode
        self.cudagraph_keys: dict[CUDAGraphMode, set[BatchDescriptor]] = {
            CUDAGraphMode.PIECEWISE: set(),
            CUDAGraphMode.FULL: set(),
        }
        self.keys_initialized = False

    def add_cudagraph_key(self, runtime_mode: CUDAGraphMode, batch_descriptor: BatchDescriptor):
        self.cudagraph_keys[runtime_mode].add(batch_descriptor)

    def initialize_cudagraph_keys(self, cudagraph_mode: CUDAGraphMode, uniform_decode_query_len: int):
        if cudagraph_mode.mixed_mode() != CUDAGraphMode.NONE:
            for bs in self.compilation_config.cudagraph_capture_sizes:
                self.add_cudagraph_key(cudagraph_mode.mixed_mode(), BatchDescriptor(num_tokens=bs))
        if cudagraph_mode.has_full_cudagraphs():
            max_num_tokens = self.vllm_config.scheduler_config.max_num_seqs * uniform_decode_query_len
            for bs in self.compilation_config.cudagraph_capture_sizes:
                if bs <= max_num_tokens:
                    self.add_cudagraph_key(CUDAGraphMode.FULL, BatchDescriptor(num_tokens=bs, uniform_decode=True))
        self.keys_initialized = True

    def dispatch(self, batch_descriptor: BatchDescriptor) -> tuple[CUDAGraphMode, Optional[BatchDescriptor]]:
        if not self.keys_initialized:
            return CUDAGraphMode.NONE, None
        assert self.cudagraph_keys is not None  # ok: FC109
        if batch_descriptor in self.cudagraph_keys[CUDAGraphMode.FULL]:
            return CUDAGraphMode.FULL, batch_descriptor
        non_uniform = batch_descriptor.non_uniform
        if non_uniform in self.cudagraph_keys[CUDAGraphMode.FULL]:
            return CUDAGraphMode.FULL, non_uniform
        if non_uniform in self.cudagraph_keys[CUDAGraphMode.PIECEWISE]:
            return CUDAGraphMode.PIECEWISE, non_uniform
        return CUDAGraphMode.NONE, None
