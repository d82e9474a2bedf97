"""Model runner: pools, the LoRA-aware model, the attention backend and the graph runner."""

import argparse
from dataclasses import dataclass, field
from typing import List, Optional

import torch
import torch.nn.functional as F
from torch import nn

from sglang.srt.layers.attention.flashinfer_backend import FlashInferAttnBackend
from sglang.srt.lora.lora_manager import LoRAConfig, LoRAManager
from sglang.srt.model_executor.cuda_graph_runner import CudaGraphRunner
from sglang.srt.model_executor.forward_batch_info import ForwardBatch


@dataclass
class ServerArgs:
    lora_paths: List[str] = field(default_factory=list)
    lora_config: LoRAConfig = field(default_factory=LoRAConfig)
    speculative_num_draft_tokens: int = 1
    disable_cuda_graph: bool = False
    max_running_requests: int = 256

    @classmethod
    def from_cli(cls, argv: Optional[List[str]] = None) -> "ServerArgs":
        parser = argparse.ArgumentParser()
        parser.add_argument("--lora-paths", nargs="*", default=[])
        parser.add_argument("--max-loras-per-batch", type=int, default=8)
        parser.add_argument("--max-lora-rank", type=int, default=64)
        parser.add_argument("--lora-sgmv-workspace-mb", type=int, default=16)
        parser.add_argument("--speculative-num-draft-tokens", type=int, default=1)
        parser.add_argument("--disable-cuda-graph", action="store_true")
        parser.add_argument("--max-running-requests", type=int, default=256)
        ns = parser.parse_args(argv)
        return cls(
            lora_paths=list(ns.lora_paths),
            lora_config=LoRAConfig(
                max_loras_per_batch=ns.max_loras_per_batch,
                max_lora_rank=ns.max_lora_rank,
                sgmv_workspace_bytes=ns.lora_sgmv_workspace_mb << 20,
            ),
            speculative_num_draft_tokens=ns.speculative_num_draft_tokens,
            disable_cuda_graph=ns.disable_cuda_graph,
            max_running_requests=ns.max_running_requests,
        )


class ReqToTokenPool:
    def __init__(self, size: int, max_context_len: int, *, device: torch.device):
        self.size = size
        self.req_to_token = torch.zeros((size, max_context_len), dtype=torch.int32, device=device)


class MHATokenToKVPool:
    def __init__(self, num_tokens: int, num_layers: int, heads: int, head_dim: int, *, dtype, device):
        self.k_buffer = [torch.zeros(num_tokens, heads, head_dim, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v_buffer = [torch.zeros(num_tokens, heads, head_dim, dtype=dtype, device=device) for _ in range(num_layers)]

    def get_kv_buffer(self, layer_id: int):
        return self.k_buffer[layer_id].unsqueeze(1), self.v_buffer[layer_id].unsqueeze(1)

    def set_kv_buffer(self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k_buffer[layer_id].index_copy_(0, loc, k.view(-1, *self.k_buffer[layer_id].shape[1:]))
        self.v_buffer[layer_id].index_copy_(0, loc, v.view(-1, *self.v_buffer[layer_id].shape[1:]))


class LoRALinear(nn.Module):
    """A base projection plus the batch's adapters, gathered per token from the memory pool slots."""

    def __init__(self, base: nn.Linear, layer_id: int, lora_manager: Optional[LoRAManager]):
        super().__init__()
        self.base = base
        self.layer_id = layer_id
        self.lora_manager = lora_manager

    def forward(self, x: torch.Tensor, forward_batch: ForwardBatch) -> torch.Tensor:
        out = self.base(x)
        info = forward_batch.lora_batch_info
        if self.lora_manager is None or info is None:
            return out
        if forward_batch.forward_mode.is_cuda_graph():
            slots = forward_batch.lora_buffer_ids.long().repeat_interleave(forward_batch.spec_num_draft_tokens)
        else:
            slots = info.token_slots
        pool = self.lora_manager.memory_pool
        a = pool.A_buffer[self.layer_id].index_select(0, slots)
        b = pool.B_buffer[self.layer_id].index_select(0, slots)
        delta = torch.bmm(b, torch.bmm(a, x.unsqueeze(-1))).squeeze(-1)
        return out + delta * info.scalings.index_select(0, slots).unsqueeze(-1).to(delta.dtype)


class RadixAttention(nn.Module):
    def __init__(self, layer_id: int, heads: int, kv_heads: int, head_dim: int, *, sliding_window_size=None, logit_cap=0.0):
        super().__init__()
        self.layer_id = layer_id
        self.tp_q_head_num = heads
        self.tp_k_head_num = kv_heads
        self.head_dim = head_dim
        self.sliding_window_size = sliding_window_size
        self.logit_cap = logit_cap

    def forward(self, q, k, v, forward_batch: ForwardBatch):
        return forward_batch.attn_backend.forward(q, k, v, self, forward_batch)


class DecoderLayer(nn.Module):
    def __init__(self, cfg, layer_id: int, lora_manager: Optional[LoRAManager], *, device, dtype):
        super().__init__()
        hidden, heads, kv_heads, hd = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.q_size, self.kv_size = heads * hd, kv_heads * hd
        qkv = nn.Linear(hidden, self.q_size + 2 * self.kv_size, bias=False, device=device, dtype=dtype)
        self.qkv_proj = LoRALinear(qkv, layer_id, lora_manager)
        self.o_proj = nn.Linear(self.q_size, hidden, bias=False, device=device, dtype=dtype)
        window = cfg.sliding_window if layer_id % 2 == 0 else None
        self.attn = RadixAttention(layer_id, heads, kv_heads, hd, sliding_window_size=window, logit_cap=cfg.attn_logit_softcapping or 0.0)
        self.gate_up = nn.Linear(hidden, 2 * cfg.intermediate_size, bias=False, device=device, dtype=dtype)
        self.down = nn.Linear(cfg.intermediate_size, hidden, bias=False, device=device, dtype=dtype)

    def forward(self, hidden: torch.Tensor, forward_batch: ForwardBatch) -> torch.Tensor:
        q, k, v = self.qkv_proj(hidden, forward_batch).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        hidden = hidden + self.o_proj(self.attn(q, k, v, forward_batch))
        gate, up = self.gate_up(hidden).chunk(2, dim=-1)
        return hidden + self.down(F.silu(gate) * up)


class LoRALlamaForCausalLM(nn.Module):
    def __init__(self, cfg, lora_manager: Optional[LoRAManager], *, device, dtype):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size, device=device, dtype=dtype)
        self.layers = nn.ModuleList(
            [DecoderLayer(cfg, i, lora_manager, device=device, dtype=dtype) for i in range(cfg.num_hidden_layers)]
        )
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False, device=device, dtype=dtype)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: ForwardBatch) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids)
        for layer in self.layers:
            hidden = layer(hidden, forward_batch)
        return self.lm_head(hidden)


class ModelRunner:
    def __init__(self, model_config, server_args: ServerArgs, *, device: torch.device, tp_size: int = 1):
        self.model_config = model_config
        self.server_args = server_args
        self.device = device
        self.dtype = model_config.dtype
        self.kv_cache_dtype = model_config.dtype
        self.tp_size = tp_size
        self.spec_num_draft_tokens = server_args.speculative_num_draft_tokens
        self.is_blackwell = torch.cuda.get_device_capability(device)[0] >= 10
        self.req_to_token_pool = ReqToTokenPool(
            server_args.max_running_requests, model_config.context_len, device=device
        )
        self.token_to_kv_pool = MHATokenToKVPool(
            model_config.num_kv_cache_tokens,
            model_config.num_hidden_layers,
            model_config.num_key_value_heads,
            model_config.head_dim,
            dtype=self.kv_cache_dtype,
            device=device,
        )
        self.lora_manager: Optional[LoRAManager] = None
        if server_args.lora_paths:
            self.lora_manager = LoRAManager(
                server_args.lora_config,
                num_layers=model_config.num_hidden_layers,
                hidden_size=model_config.hidden_size,
                dtype=self.dtype,
                device=device,
            )
            for i, path in enumerate(server_args.lora_paths):
                self.lora_manager.load_lora_adapter(f"adapter{i}", path)
        self.model = LoRALlamaForCausalLM(model_config, self.lora_manager, device=device, dtype=self.dtype)
        self.attn_backend = FlashInferAttnBackend(self)
        self.graph_memory_pool = None
        self.cuda_graph_runner: Optional[CudaGraphRunner] = None
        if not server_args.disable_cuda_graph:
            self.cuda_graph_runner = CudaGraphRunner(self)

    def forward(self, forward_batch: ForwardBatch) -> torch.Tensor:
        if self.cuda_graph_runner is not None and self.cuda_graph_runner.can_run(forward_batch):
            return self.cuda_graph_runner.replay(forward_batch)
        self.attn_backend.init_forward_metadata(forward_batch)
        return self.model.forward(forward_batch.input_ids, forward_batch.positions, forward_batch)
