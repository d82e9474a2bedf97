from __future__ import annotations

import numpy as np
import torch

from blendserve.attn.backend import BlendFlashInferBackend
from blendserve.batch import ForwardBatch, ForwardMode
from blendserve.blend.cow import BlendCoW
from blendserve.model.llama import BlendLlama
from blendserve.runner.cuda_graph_runner import CudaGraphRunner
from blendserve.store.chunk_store import ChunkKVStore


class ModelRunner:
    def __init__(self, config, kv_pool, device: torch.device):
        self.config = config
        self.device = device
        self.kv_pool = kv_pool
        self.attn_backend = BlendFlashInferBackend(self)
        self.chunk_store = ChunkKVStore(
            config.page_size, config.chunk_store_pages, self.attn_backend.decode_wrapper, kv_pool.free_pages
        )
        self.model = BlendLlama(config, self.attn_backend, BlendCoW(kv_pool, config.page_size)).to(device)
        self.model.kv_caches = kv_pool.layer_caches
        self.cuda_graph_runner = CudaGraphRunner(self, config.graph_buckets)
        self.cuda_graph_runner.capture()

    def forward(self, fb: ForwardBatch, query_lens: np.ndarray = None) -> torch.Tensor:
        if self.cuda_graph_runner.can_run(fb):
            return self.cuda_graph_runner.replay(fb)
        self.attn_backend.init_forward_metadata(fb)
        if fb.forward_mode == ForwardMode.BLEND:
            return self.model.forward_blend(fb, query_lens)
        if fb.forward_mode == ForwardMode.EXTEND:
            return self.model.forward_extend(fb)
        return self.model.forward_decode(fb.input_ids, fb.positions, fb)
