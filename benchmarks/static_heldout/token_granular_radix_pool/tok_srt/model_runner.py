from __future__ import annotations

import dataclasses
from typing import Optional

import torch
from torch import nn

from tok_srt.cuda_graph_runner import CudaGraphRunner
from tok_srt.flashinfer_backend import FlashInferAttnBackend
from tok_srt.forward_batch import ForwardBatch
from tokpool.memory_pool import MHATokenToKVPool, ReqToTokenPool


@dataclasses.dataclass
class ServerArgs:
    num_layers: int = 32
    hidden_size: int = 4096
    vocab_size: int = 128256
    num_attention_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    context_len: int = 32768
    max_running_requests: int = 160
    kv_pool_tokens: int = 1_500_000
    chunked_prefill_size: int = 8192
    max_mask_len: int = 1 << 20
    speculative_num_draft_tokens: Optional[int] = None
    eos_token_id: int = 128009
    disable_cuda_graph: bool = False


class TokenAttnLayer(nn.Module):
    def __init__(self, args: ServerArgs, layer_id: int):
        super().__init__()
        self.layer_id = layer_id
        self.num_heads = args.num_attention_heads
        self.num_kv_heads = args.num_kv_heads
        self.head_dim = args.head_dim
        q_out = args.num_attention_heads * args.head_dim
        kv_out = args.num_kv_heads * args.head_dim
        self.qkv_proj = nn.Linear(args.hidden_size, q_out + 2 * kv_out, bias=False)
        self.o_proj = nn.Linear(q_out, args.hidden_size, bias=False)
        self.norm = nn.RMSNorm(args.hidden_size)

    def forward(self, h: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        q_out = self.num_heads * self.head_dim
        kv_out = self.num_kv_heads * self.head_dim
        q, k, v = self.qkv_proj(self.norm(h)).split([q_out, kv_out, kv_out], dim=-1)
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        o = fb.attn_backend.forward(q, k, v, self.layer_id, fb)
        return h + self.o_proj(o.reshape(o.shape[0], -1))


class TokenModel(nn.Module):
    def __init__(self, args: ServerArgs):
        super().__init__()
        self.embed = nn.Embedding(args.vocab_size, args.hidden_size)
        self.layers = nn.ModuleList([TokenAttnLayer(args, i) for i in range(args.num_layers)])
        self.norm = nn.RMSNorm(args.hidden_size)
        self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer(h, fb)
        return self.lm_head(self.norm(h))


class ModelRunner:
    def __init__(self, server_args: ServerArgs, device: torch.device):
        self.server_args = server_args
        self.device = device
        self.req_to_token_pool = ReqToTokenPool(
            server_args.max_running_requests + 1, server_args.context_len + 4, device
        )
        self.token_to_kv_pool = MHATokenToKVPool(
            server_args.kv_pool_tokens,
            torch.bfloat16,
            server_args.num_kv_heads,
            server_args.head_dim,
            server_args.num_layers,
            device,
        )
        self.attn_backend = FlashInferAttnBackend(self)
        self.model = TokenModel(server_args).to(device=device, dtype=torch.bfloat16)
        self.cuda_graph_runner: Optional[CudaGraphRunner] = None
        if not server_args.disable_cuda_graph:
            self.cuda_graph_runner = CudaGraphRunner(self)
            self.cuda_graph_runner.capture()

    def forward(self, fb: ForwardBatch) -> torch.Tensor:
        if self.cuda_graph_runner is not None and self.cuda_graph_runner.can_run(fb):
            return self.cuda_graph_runner.replay(fb)
        self.attn_backend.init_forward_metadata(fb)
        return self.model.forward(fb.input_ids, fb.positions, fb)
