"""Model runner with a DeepSeek-V3-shaped stand-in model (absorbed MLA attention, DP-attention gather)."""

from __future__ import annotations

from typing import List, Optional

import torch
import torch.distributed as dist
from torch import nn

from srt.layers.attention.flashinfer_mla_backend import FlashInferMLAAttnBackend
from srt.layers.dp_attention import DpPaddingMode, dp_gather_padded
from srt.model_executor.cuda_graph_runner import CudaGraphRunner
from srt.model_executor.forward_batch_info import ForwardBatch
from srt.two_batch_overlap import TboAttnBackend


class ReqToTokenPool:
    def __init__(self, size: int, max_context_len: int, device: torch.device):
        self.size = size
        self.req_to_token = torch.zeros((size, max_context_len), dtype=torch.int32, device=device)


class DeepseekV2AttentionMLA(nn.Module):
    def __init__(self, config, layer_id: int):
        super().__init__()
        self.layer_id = layer_id
        self.num_local_heads = config.num_attention_heads // config.tp_size
        self.kv_lora_rank = config.kv_lora_rank
        self.qk_nope_head_dim = config.qk_nope_head_dim
        self.qk_rope_head_dim = config.qk_rope_head_dim
        self.scaling = config.scaling
        self.q_proj = nn.Linear(config.hidden_size, self.num_local_heads * (self.qk_nope_head_dim + self.qk_rope_head_dim), bias=False)
        self.kv_a_proj = nn.Linear(config.hidden_size, self.kv_lora_rank + self.qk_rope_head_dim, bias=False)
        self.w_kc = nn.Parameter(torch.empty(self.num_local_heads, self.qk_nope_head_dim, self.kv_lora_rank))
        self.w_vc = nn.Parameter(torch.empty(self.num_local_heads, self.kv_lora_rank, config.v_head_dim))
        self.o_proj = nn.Linear(self.num_local_heads * config.v_head_dim, config.hidden_size, bias=False)

    def forward(self, hidden: torch.Tensor, positions: torch.Tensor, forward_batch: ForwardBatch, kv_buffer: torch.Tensor) -> torch.Tensor:
        q = self.q_proj(hidden).view(-1, self.num_local_heads, self.qk_nope_head_dim + self.qk_rope_head_dim)
        q_nope, q_rope = q.split([self.qk_nope_head_dim, self.qk_rope_head_dim], dim=-1)
        kv_buffer[forward_batch.out_cache_loc] = self.kv_a_proj(hidden).unsqueeze(1)
        # absorb W_UK so attention runs in the latent space
        q_absorbed = torch.bmm(q_nope.transpose(0, 1), self.w_kc).transpose(0, 1)
        attn = forward_batch.attn_backend.forward(q_absorbed, q_rope, kv_buffer, self, forward_batch)
        out = torch.bmm(attn.transpose(0, 1), self.w_vc).transpose(0, 1)
        return self.o_proj(out.flatten(1))


class DeepseekV2DecoderLayer(nn.Module):
    def __init__(self, config, layer_id: int):
        super().__init__()
        self.self_attn = DeepseekV2AttentionMLA(config, layer_id)
        self.moe = nn.Linear(config.hidden_size, config.hidden_size)  # stands in for the DeepEP MoE
        self.pad_mode = DpPaddingMode(config.dp_padding_mode)
        self.dp_group = None
        self.dp_rank = config.dp_rank

    def forward(self, hidden, positions, forward_batch: ForwardBatch, kv_buffer) -> torch.Tensor:
        hidden = hidden + self.self_attn(hidden, positions, forward_batch, kv_buffer)
        gathered = dp_gather_padded(hidden, forward_batch, self.pad_mode, self.dp_group, self.dp_rank)
        return hidden + self.moe(gathered)[: hidden.shape[0]]


class DeepseekV3ForCausalLM(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList([DeepseekV2DecoderLayer(config, i) for i in range(config.num_hidden_layers)])
        self.kv_buffers: List[torch.Tensor] = []

    def forward(self, input_ids, positions, forward_batch: ForwardBatch) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids)
        for layer, kv_buffer in zip(self.layers, self.kv_buffers):
            hidden = layer(hidden, positions, forward_batch, kv_buffer)
        return hidden


class ModelRunner:
    def __init__(self, model_config, server_args, tp_size: int, device: torch.device, tp_group):
        self.model_config = model_config
        self.server_args = server_args
        self.tp_size = tp_size
        self.device = device
        self.tp_group = tp_group
        self.dtype = torch.bfloat16
        self.kv_cache_dtype = torch.bfloat16
        self.page_size = 1
        self.model = DeepseekV3ForCausalLM(model_config).to(device)
        self.max_total_num_tokens = self.profile_max_num_token()
        self.req_to_token_pool = ReqToTokenPool(server_args.max_running_requests, model_config.context_len, device)
        self.init_kv_cache()
        self.init_attention_backend()
        self.graph_mempool = torch.cuda.graph_pool_handle()
        self.cuda_graph_runner: Optional[CudaGraphRunner] = None if server_args.disable_cuda_graph else CudaGraphRunner(self)

    def profile_max_num_token(self) -> int:
        free_bytes, _ = torch.cuda.mem_get_info(self.device)
        free = torch.tensor([free_bytes], dtype=torch.int64, device=self.device)
        dist.all_reduce(free, op=dist.ReduceOp.MIN, group=self.tp_group)
        cfg = self.model_config
        cell = cfg.num_hidden_layers * (cfg.kv_lora_rank + cfg.qk_rope_head_dim) * 2
        return int(free.item() * self.server_args.mem_fraction_static) // cell  # ok: FC101

    def init_kv_cache(self) -> None:
        cfg = self.model_config
        self.model.kv_buffers = [
            torch.zeros((self.max_total_num_tokens, 1, cfg.kv_lora_rank + cfg.qk_rope_head_dim), dtype=self.kv_cache_dtype, device=self.device)
            for _ in range(cfg.num_hidden_layers)
        ]

    def init_attention_backend(self) -> None:
        if self.server_args.enable_two_batch_overlap:
            self.attn_backend = TboAttnBackend.init_new(lambda: FlashInferMLAAttnBackend(self))
        else:
            self.attn_backend = FlashInferMLAAttnBackend(self)

    def forward(self, forward_batch: ForwardBatch) -> torch.Tensor:
        if self.cuda_graph_runner is not None and self.cuda_graph_runner.can_run(forward_batch):
            return self.cuda_graph_runner.replay(forward_batch)
        self.attn_backend.init_forward_metadata(forward_batch)
        return self.model.forward(forward_batch.input_ids, forward_batch.positions, forward_batch)
