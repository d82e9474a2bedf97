from __future__ import annotations

import torch

from sglang.srt.layers.attention.flashinfer_backend import FlashInferAttnBackend
from sglang.srt.model_executor.cuda_graph_runner import CudaGraphRunner
from sglang.srt.model_executor.forward_batch_info import ForwardBatch


class ModelRunner:
    def __init__(self, model_config, server_args, req_to_token_pool, model, device="cuda"):
        self.device = device
        self.model_config = model_config
        self.req_to_token_pool = req_to_token_pool
        self.model = model
        self.attn_backend = FlashInferAttnBackend(self)
        self.cuda_graph_runner = None
        if not server_args.disable_cuda_graph:
            self.cuda_graph_runner = CudaGraphRunner(self)
            self.cuda_graph_runner.capture()
        torch.cuda.synchronize()  # ok: FC101

    def forward_decode(self, input_ids, forward_batch: ForwardBatch):
        q, k_cache, v_cache = self.model.qkv(input_ids, forward_batch.out_cache_loc)
        return self.attn_backend.forward_decode(q, k_cache, v_cache)

    def forward(self, forward_batch: ForwardBatch, input_ids):
        if self.cuda_graph_runner is not None and self.cuda_graph_runner.can_run(forward_batch):
            return self.cuda_graph_runner.replay(forward_batch)
        self.attn_backend.init_forward_metadata(forward_batch)
        return self.forward_decode(input_ids, forward_batch)
