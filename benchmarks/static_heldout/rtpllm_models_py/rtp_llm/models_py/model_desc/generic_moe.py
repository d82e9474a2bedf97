"""Generic MoE decoder (Qwen3-MoE style) for the Python model path."""

from dataclasses import dataclass
from typing import List, Optional

import torch
from torch import nn

from rtp_llm.models_py.model_desc.cuda_graph_runner import CudaGraphRunner
from rtp_llm.models_py.modules.attn_inputs import AttentionInputs
from rtp_llm.models_py.modules.flashinfer_python import PyFlashinferDecodeAttnOp, PyFlashinferPrefillAttnOp
from rtp_llm.models_py.modules.fused_moe import FusedMoe


@dataclass
class PyModelOutputs:
    hidden_states: torch.Tensor


class RMSNorm(nn.Module):
    def __init__(self, hidden: int, eps: float, *, device, dtype):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden, device=device, dtype=dtype))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(var + self.eps)).to(x.dtype) * self.weight


class PagedKVCache:
    """K and V pages of one layer, HND (what the FlashInfer ops were planned for)."""

    def __init__(self, num_pages: int, page_size: int, heads: int, head_dim: int, *, dtype, device):
        self.kv = torch.empty(num_pages, 2, heads, page_size, head_dim, dtype=dtype, device=device)
        self.page_size = page_size

    def write(self, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        page = slot_mapping // self.page_size
        offset = slot_mapping % self.page_size
        self.kv[page, 0, :, offset] = k
        self.kv[page, 1, :, offset] = v


class GenericMoeDecoderLayer(nn.Module):
    def __init__(
        self,
        config,
        layer_idx: int,
        *,
        prefill_op: PyFlashinferPrefillAttnOp,
        decode_op: PyFlashinferDecodeAttnOp,
        device,
    ):
        super().__init__()
        dtype = config.data_type
        self.layer_idx = layer_idx
        self.heads = config.head_num // config.tp_size
        self.kv_heads = max(config.head_num_kv // config.tp_size, 1)
        self.head_dim = config.size_per_head
        self.qkv_proj = nn.Linear(
            config.hidden_size, (self.heads + 2 * self.kv_heads) * self.head_dim, bias=False, device=device, dtype=dtype
        )
        self.o_proj = nn.Linear(self.heads * self.head_dim, config.hidden_size, bias=False, device=device, dtype=dtype)
        self.input_layernorm = RMSNorm(config.hidden_size, config.layernorm_eps, device=device, dtype=dtype)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.layernorm_eps, device=device, dtype=dtype)
        self.mlp = FusedMoe(config, device=device)
        self.prefill_op = prefill_op
        self.decode_op = decode_op

    def _qkv(self, hidden: torch.Tensor, kv_cache: PagedKVCache, slot_mapping: torch.Tensor) -> torch.Tensor:
        qkv = self.qkv_proj(self.input_layernorm(hidden))
        q, k, v = qkv.split(
            [self.heads * self.head_dim, self.kv_heads * self.head_dim, self.kv_heads * self.head_dim], dim=-1
        )
        kv_cache.write(k.view(-1, self.kv_heads, self.head_dim), v.view(-1, self.kv_heads, self.head_dim), slot_mapping)
        return q.view(-1, self.heads, self.head_dim)

    def _finish(self, hidden: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        hidden = hidden + self.o_proj(attn.reshape(hidden.shape[0], -1))
        return hidden + self.mlp(self.post_attention_layernorm(hidden))

    def forward_prefill(self, hidden: torch.Tensor, kv_cache: PagedKVCache, slot_mapping: torch.Tensor) -> torch.Tensor:
        q = self._qkv(hidden, kv_cache, slot_mapping)
        return self._finish(hidden, self.prefill_op.forward(q, kv_cache.kv, self.layer_idx))

    def forward_decode(self, hidden: torch.Tensor, kv_cache: PagedKVCache, slot_mapping: torch.Tensor) -> torch.Tensor:
        q = self._qkv(hidden, kv_cache, slot_mapping)
        return self._finish(hidden, self.decode_op.forward(q, kv_cache.kv, self.layer_idx))


class GenericMoeModel(nn.Module):
    def __init__(self, config, *, device: torch.device, num_pages: int, cuda_graph_batch_sizes: List[int] = ()):
        super().__init__()
        self.config = config
        self.device = device
        dtype = config.data_type
        self.prefill_op = PyFlashinferPrefillAttnOp(config, device=device)
        self.decode_op = PyFlashinferDecodeAttnOp(config, device=device)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, device=device, dtype=dtype)
        self.layers = nn.ModuleList(
            [
                GenericMoeDecoderLayer(config, i, prefill_op=self.prefill_op, decode_op=self.decode_op, device=device)
                for i in range(config.layer_num)
            ]
        )
        self.norm = RMSNorm(config.hidden_size, config.layernorm_eps, device=device, dtype=dtype)
        kv_heads = max(config.head_num_kv // config.tp_size, 1)
        self.kv_caches = [
            PagedKVCache(num_pages, config.seq_size_per_block, kv_heads, config.size_per_head, dtype=dtype, device=device)
            for _ in range(config.layer_num)
        ]
        self.shared_prefix_len = int(config.shared_prefix_len)
        self.graph_runner: Optional[CudaGraphRunner] = None
        if cuda_graph_batch_sizes:
            self.graph_runner = CudaGraphRunner(
                self,
                self.decode_op,
                batch_sizes=list(cuda_graph_batch_sizes),
                num_speculative=int(config.gen_num_per_cycle) - 1,
                device=device,
            )

    def decode_step(self, input_ids: torch.Tensor, slot_mapping: torch.Tensor) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids)
        for layer, kv_cache in zip(self.layers, self.kv_caches):
            hidden = layer.forward_decode(hidden, kv_cache, slot_mapping)
        return self.norm(hidden)

    def forward(self, inputs) -> PyModelOutputs:
        attn_inputs = AttentionInputs.from_engine(inputs.attention_inputs, self.device)
        if attn_inputs.is_prefill:
            self.prefill_op.prepare(attn_inputs)
            hidden = self.embed_tokens(inputs.input_ids)
            for layer, kv_cache in zip(self.layers, self.kv_caches):
                hidden = layer.forward_prefill(hidden, kv_cache, inputs.slot_mapping)
            return PyModelOutputs(self.norm(hidden))
        if self.graph_runner is not None and self.graph_runner.can_run(attn_inputs):
            return PyModelOutputs(self.graph_runner.replay(inputs, attn_inputs))
        self.decode_op.prepare(attn_inputs)
        return PyModelOutputs(self.decode_step(inputs.input_ids, inputs.slot_mapping))
