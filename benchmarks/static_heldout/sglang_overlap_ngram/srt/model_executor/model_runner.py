from __future__ import annotations

import torch

from ..layers.attention.flashinfer_backend import FlashInferAttnBackend
from ..models.llama import LlamaForCausalLM
from .cuda_graph_runner import CudaGraphRunner
from .forward_batch_info import ForwardBatch


class ModelRunner:
    def __init__(self, server_args, model_config, token_to_kv_pool, device: torch.device) -> None:
        self.server_args, self.model_config, self.device = server_args, model_config, device
        self.token_to_kv_pool = token_to_kv_pool
        self.req_to_token = torch.zeros((server_args.max_running_requests, server_args.context_len), dtype=torch.int32, device=device)
        self.model = LlamaForCausalLM(model_config).to(device)
        self.attn_backend = FlashInferAttnBackend(self)
        self.cuda_graph_runner = CudaGraphRunner(self)
        self.cuda_graph_runner.capture()

    def forward(self, fb: ForwardBatch) -> torch.Tensor:
        if fb.forward_mode.is_cuda_graph() and fb.batch_size <= self.cuda_graph_runner.max_bs:
            return self.cuda_graph_runner.replay(fb)
        self.attn_backend.init_forward_metadata(fb)
        return self.model.forward(fb.input_ids, fb.positions, fb)
