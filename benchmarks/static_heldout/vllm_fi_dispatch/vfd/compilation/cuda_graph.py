"""Wraps a runnable; captures one CUDA graph per batch descriptor and replays it afterwards."""

from __future__ import annotations

import dataclasses
import logging
from contextlib import ExitStack
from typing import Any, Callable, Optional
from unittest.mock import patch

import torch

from vfd import envs
from vfd.config import CUDAGraphMode, VllmConfig
from vfd.forward_context import BatchDescriptor, get_forward_context

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class CUDAGraphEntry:
    batch_descriptor: BatchDescriptor
    cudagraph: Optional[torch.cuda.CUDAGraph] = None
    output: Optional[Any] = None
    input_addresses: Optional[list[int]] = None


def weak_ref_tensors(x):
    return x


class CUDAGraphWrapper:
    """vLLM's ``CUDAGraphWrapper``: a no-op unless the forward context asks for this wrapper's runtime mode."""

    def __init__(self, runnable: Callable, vllm_config: VllmConfig, runtime_mode: CUDAGraphMode, graph_pool=None):
        self.runnable = runnable
        self.vllm_config = vllm_config
        self.runtime_mode = runtime_mode
        self.graph_pool = graph_pool if graph_pool is not None else torch.cuda.graph_pool_handle()
        self.is_debugging_mode = envs.VLLM_LOGGING_LEVEL == "DEBUG"
        self.concrete_cudagraph_entries: dict[BatchDescriptor, CUDAGraphEntry] = {}

    def __getattr__(self, key: str):
        if key == "runnable":
            raise AttributeError(key)
        return getattr(self.runnable, key)

    def __call__(self, *args, **kwargs):
        forward_context = get_forward_context()
        batch_descriptor = forward_context.batch_descriptor
        runtime_mode = forward_context.cudagraph_runtime_mode
        if runtime_mode == CUDAGraphMode.NONE or runtime_mode != self.runtime_mode:
            return self.runnable(*args, **kwargs)
        entry = self.concrete_cudagraph_entries.get(batch_descriptor)
        if entry is None:
            entry = CUDAGraphEntry(batch_descriptor=batch_descriptor)
            self.concrete_cudagraph_entries[batch_descriptor] = entry
        if entry.cudagraph is None:
            return self._capture(entry, args, kwargs)
        if self.is_debugging_mode:
            new_input_addresses = [x.data_ptr() for x in args if isinstance(x, torch.Tensor)]
            assert new_input_addresses == entry.input_addresses, (  # expect: FC109
                f"Input addresses for cudagraphs are different during replay. "
                f"Expected {entry.input_addresses}, got {new_input_addresses}"
            )
        entry.cudagraph.replay()
        return entry.output

    def _capture(self, entry: CUDAGraphEntry, args, kwargs):
        logger.debug("Capturing a cudagraph for %s", entry.batch_descriptor)
        entry.input_addresses = [x.data_ptr() for x in args if isinstance(x, torch.Tensor)]
        cudagraph = torch.cuda.CUDAGraph()
        with ExitStack() as stack:
            if envs.VLLM_CUDAGRAPH_GC_DISABLE:
                stack.enter_context(patch("gc.collect", lambda: None))
                stack.enter_context(patch("torch.cuda.empty_cache", lambda: None))
            with torch.cuda.graph(cudagraph, pool=self.graph_pool):
                output = self.runnable(*args, **kwargs)
                output = weak_ref_tensors(output)
        entry.output = output
        entry.cudagraph = cudagraph
        torch.cuda.synchronize()  # ok: FC101
        return output
