from __future__ import annotations

import logging
from dataclasses import dataclass, field
from types import SimpleNamespace

import torch

from sgl_pw.layers.attention.flashinfer_backend import FlashInferAttnBackend
from sgl_pw.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from sgl_pw.model_executor.cuda_graph_runner import CudaGraphRunner
from sgl_pw.model_executor.forward_batch_info import ForwardBatch
from sgl_pw.model_executor.piecewise_cuda_graph_runner import PiecewiseCudaGraphRunner
from sgl_pw.model_executor.tiny_model import TinyForCausalLM

logger = logging.getLogger(__name__)


@dataclass
class ServerArgs:
    max_running_requests: int = 256
    max_total_tokens: int = 1 << 20
    page_size: int = 1
    disable_cuda_graph: bool = False
    enable_piecewise_cuda_graph: bool = True
    enable_custom_mask: bool = False
    cuda_graph_bs: list = field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64])
    piecewise_cuda_graph_tokens: list = field(default_factory=lambda: [16, 64, 256, 1024, 4096])
    piecewise_cuda_graph_max_bs: int = 64


class ModelRunner:
    def __init__(self, model_config, server_args: ServerArgs, device: str = "cuda", tp_size: int = 1):
        self.model_config = model_config
        self.server_args = server_args
        self.device = device
        self.tp_size = tp_size
        self.dtype = torch.bfloat16
        self.kv_cache_dtype = torch.bfloat16
        self.graph_pool = torch.cuda.graph_pool_handle()
        self.model = TinyForCausalLM(model_config).to(device)
        self.req_to_token_pool = ReqToTokenPool(server_args.max_running_requests, model_config.context_len, device)
        self.token_to_kv_pool = MHATokenToKVPool(
            server_args.max_total_tokens,
            server_args.page_size,
            model_config.num_key_value_heads,
            model_config.head_dim,
            model_config.num_hidden_layers,
            self.kv_cache_dtype,
            device,
        )
        self.attn_backend = FlashInferAttnBackend(self)
        self.cuda_graph_runner = None if server_args.disable_cuda_graph else CudaGraphRunner(self)
        self.piecewise_cuda_graph_runner = (
            PiecewiseCudaGraphRunner(self) if server_args.enable_piecewise_cuda_graph else None
        )

    def forward_decode(self, forward_batch: ForwardBatch) -> torch.Tensor:
        if self.cuda_graph_runner is not None and forward_batch.batch_size <= self.cuda_graph_runner.max_bs:
            return self.cuda_graph_runner.replay(forward_batch)
        self.attn_backend.init_forward_metadata(forward_batch)
        return self.model.forward(forward_batch.input_ids, forward_batch.positions, forward_batch)

    def forward_extend(self, forward_batch: ForwardBatch) -> torch.Tensor:
        pw = self.piecewise_cuda_graph_runner
        if pw is not None and pw.can_run(forward_batch):
            return pw.replay(forward_batch)
        self.attn_backend.init_forward_metadata(forward_batch)
        return self.model.forward(forward_batch.input_ids, forward_batch.positions, forward_batch)

    def remap_kv_pages(self, old_to_new: torch.Tensor) -> None:
        """After the pool compacts its pages, rewrite the page ids the decode graphs read."""
        if self.cuda_graph_runner is None:
            return
        indices = self.attn_backend.cuda_graph_kv_indices
        indices.copy_(old_to_new[indices.long()])  # expect: FC104
