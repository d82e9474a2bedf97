import dataclasses
from typing import Any, Callable, Optional

import torch

from vllm import envs


@dataclasses.dataclass
class CUDAGraphEntry:
    batch_descriptor: Any
    cudagraph: Optional[torch.cuda.CUDAGraph] = None
    output: Optional[Any] = None
    input_addresses: Optional[list] = None


class CUDAGraphWrapper:
    def __init__(self, runnable: Callable, graph_pool=None):
        self.runnable = runnable
        self.graph_pool = graph_pool
        self.entries: dict = {}

    def __call__(self, batch_descriptor, *args):
        entry = self.entries.setdefault(batch_descriptor, CUDAGraphEntry(batch_descriptor))
        if entry.cudagraph is None:
            return self._capture_entry(entry, args)
        if envs.VLLM_CUDAGRAPH_DEBUG:
            new_addresses = [x.data_ptr() for x in args if isinstance(x, torch.Tensor)]
            assert new_addresses == entry.input_addresses, "inputs moved since capture"  # expect: FC109
        entry.cudagraph.replay()
        return entry.output

    def _capture_entry(self, entry, args):
        entry.input_addresses = [x.data_ptr() for x in args if isinstance(x, torch.Tensor)]
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.graph_pool):
            entry.output = self.runnable(*args)
        entry.cudagraph = graph
        return entry.output
