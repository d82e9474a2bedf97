import logging
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from vllm.v1.attention.backends.mla.flashinfer_mla import FlashInferMLAImpl

logger = logging.getLogger(__name__)


@dataclass
class CUDAGraphEntry:
    num_tokens: int
    graph: Optional[torch.cuda.CUDAGraph] = None
    output: Any = None
    input_addresses: list = field(default_factory=list)


class CUDAGraphWrapper:
    def __init__(self, impl: FlashInferMLAImpl, debug_mode: bool = False):
        self.impl = impl
        self.debug_mode = debug_mode
        self.entries = {}

    def capture(self, num_tokens, q, kv_cache, attn_metadata):
        entry = CUDAGraphEntry(num_tokens)
        entry.input_addresses = [x.data_ptr() for x in (q, kv_cache) if isinstance(x, torch.Tensor)]  # ok: FC101
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            entry.output = self.impl.forward_decode(q, kv_cache, attn_metadata)
        entry.graph = graph
        self.entries[num_tokens] = entry
        logger.debug("captured %d-token graph at %s", num_tokens, hex(q.data_ptr()))  # ok: FC101

    def replay(self, num_tokens, q, kv_cache):
        entry = self.entries[num_tokens]
        if self.debug_mode:
            new_addresses = [x.data_ptr() for x in (q, kv_cache)]  # ok: FC101
            if new_addresses != entry.input_addresses:
                raise RuntimeError("input addresses changed between capture and replay")
        entry.graph.replay()
        return entry.output
