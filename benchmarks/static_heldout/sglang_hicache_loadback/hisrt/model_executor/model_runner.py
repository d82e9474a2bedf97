"""Forward batch, a small decoder and the model runner that owns the pools, the backend and the graphs."""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum, auto
from typing import List, Optional

import torch
from torch import nn

from hisrt.attention.flashinfer_backend import FlashInferAttnBackend
from hisrt.mem_cache.hicache import HiCacheController, HiRadixCache, LoadBackOp
from hisrt.mem_cache.memory_pool import MHATokenToKVPool, MHATokenToKVPoolHost


class ForwardMode(IntEnum):
    EXTEND = auto()
    DECODE = auto()
    IDLE = auto()

    def is_decode(self) -> bool:
        return self == ForwardMode.DECODE


@dataclass
class ForwardBatch:
    forward_mode: ForwardMode
    batch_size: int
    input_ids: torch.Tensor
    positions: torch.Tensor
    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    seq_lens_sum: int
    out_cache_loc: torch.Tensor
    extend_prefix_lens: Optional[torch.Tensor] = None
    extend_seq_lens_cpu: List[int] = field(default_factory=list)
    host_hit_lens_cpu: List[int] = field(default_factory=list)
    hicache_load: Optional[LoadBackOp] = None

    @classmethod
    def init_new(cls, batch, device: str) -> "ForwardBatch":
        """``batch`` is the scheduler's ScheduleBatch (host lists and the allocator's out_cache_loc)."""
        ret = cls(
            forward_mode=batch.forward_mode,
            batch_size=len(batch.reqs),
            input_ids=torch.tensor(batch.input_ids, dtype=torch.int64).to(device, non_blocking=True),
            positions=torch.tensor(batch.positions, dtype=torch.int64).to(device, non_blocking=True),
            req_pool_indices=torch.tensor(batch.req_pool_indices, dtype=torch.int64).to(device, non_blocking=True),
            seq_lens=torch.tensor(batch.seq_lens, dtype=torch.int64).to(device, non_blocking=True),
            seq_lens_cpu=torch.tensor(batch.seq_lens, dtype=torch.int64),
            seq_lens_sum=sum(batch.seq_lens),
            out_cache_loc=batch.out_cache_loc,
        )
        if not ret.forward_mode.is_decode():
            ret.extend_prefix_lens = torch.tensor(batch.prefix_lens, dtype=torch.int64).to(device, non_blocking=True)
            ret.extend_seq_lens_cpu = list(batch.extend_lens)
            ret.host_hit_lens_cpu = list(batch.host_hit_lens)
            ret.hicache_load = batch.hicache_load
        return ret


@dataclass
class AttnLayerSpec:
    layer_id: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    logit_cap: float


class DecoderLayer(nn.Module):
    def __init__(self, cfg, spec: AttnLayerSpec, backend: FlashInferAttnBackend) -> None:
        super().__init__()
        self.spec = spec
        self.attn_backend = backend
        q, kv = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
        self.qkv = nn.Linear(cfg.hidden_size, q + 2 * kv, bias=False)
        self.o_proj = nn.Linear(q, cfg.hidden_size, bias=False)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.hidden_size, cfg.intermediate_size), nn.SiLU(), nn.Linear(cfg.intermediate_size, cfg.hidden_size)
        )
        self.sizes = (q, kv, kv)

    def _qkv(self, h: torch.Tensor):
        q, k, v = self.qkv(h).split(self.sizes, dim=-1)
        return q, k.view(-1, self.spec.num_kv_heads, self.spec.head_dim), v.view(-1, self.spec.num_kv_heads, self.spec.head_dim)

    def decode(self, h: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        h = h + self.o_proj(self.attn_backend.forward_decode(*self._qkv(h), self.spec, fb))
        return h + self.mlp(h)

    def extend(self, h: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        h = h + self.o_proj(self.attn_backend.forward_extend(*self._qkv(h), self.spec, fb))
        return h + self.mlp(h)


class TinyDecoder(nn.Module):
    def __init__(self, cfg, backend: FlashInferAttnBackend, tp_size: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        caps = set(cfg.softcap_layers or [])
        nh, nkv = cfg.num_attention_heads // tp_size, cfg.num_key_value_heads // tp_size
        specs = [
            AttnLayerSpec(i, nh, nkv, cfg.head_dim, cfg.attn_logit_softcapping if i in caps else 0.0)
            for i in range(cfg.num_hidden_layers)
        ]
        self.layers = nn.ModuleList([DecoderLayer(cfg, spec, backend) for spec in specs])
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def run_decode(self, input_ids: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer.decode(h, fb)
        return self.lm_head(h)

    def run_extend(self, input_ids: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer.extend(h, fb)
        return self.lm_head(h)


class ModelRunner:
    def __init__(self, model_config, server_args, tp_size: int = 1, device: str = "cuda") -> None:
        from hisrt.model_executor.cuda_graph_runner import CudaGraphRunner

        self.model_config = model_config
        self.server_args = server_args
        self.tp_size = tp_size
        self.device = device
        self.dtype = torch.bfloat16
        self.kv_cache_dtype = torch.bfloat16
        self.max_context_len = server_args.context_length
        self.req_to_token = torch.zeros(
            server_args.max_running_requests + 1, self.max_context_len, dtype=torch.int32, device=device
        )
        self.token_to_kv_pool = MHATokenToKVPool(
            server_args.max_total_tokens,
            1,
            self.kv_cache_dtype,
            model_config.num_key_value_heads // tp_size,
            model_config.head_dim,
            model_config.num_hidden_layers,
            device,
        )
        self.attn_backend = FlashInferAttnBackend(self)
        self.model = TinyDecoder(model_config, self.attn_backend, tp_size).to(device)

        self.host_pool = MHATokenToKVPoolHost(self.token_to_kv_pool, server_args.hicache_ratio)
        self.cache_controller = HiCacheController(
            self.token_to_kv_pool, self.host_pool, self.attn_backend, server_args.hicache_io_backend
        )
        self.tree_cache = HiRadixCache(self.token_to_kv_pool, self.cache_controller)
        self.attn_backend.hicache_ctrl = self.cache_controller

        self.cuda_graph_runner = None if server_args.disable_cuda_graph else CudaGraphRunner(self)

    def run_decode_batch(self, fb: ForwardBatch) -> torch.Tensor:
        if self.cuda_graph_runner is not None and self.cuda_graph_runner.can_run(fb):
            return self.cuda_graph_runner.replay(fb)
        self.attn_backend.init_forward_metadata(fb)
        return self.model.run_decode(fb.input_ids, fb.positions, fb)

    def run_extend_batch(self, fb: ForwardBatch) -> torch.Tensor:
        self.attn_backend.init_forward_metadata(fb)
        logits = self.model.run_extend(fb.input_ids, fb.positions, fb)
        self.token_to_kv_pool.layer_transfer_counter.reset()
        return logits
