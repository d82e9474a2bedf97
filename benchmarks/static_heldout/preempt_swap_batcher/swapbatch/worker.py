"""The cache engine (GPU and pinned CPU block pools, swap copies on a side stream) and the model."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch
from torch import nn
from flashinfer.page import append_paged_kv_cache
from flashinfer.rope import apply_rope_pos_ids_inplace

from swapbatch.attn.decode_backend import FlashInferDecodeBackend


class CacheEngine:
    def __init__(
        self, num_layers: int, num_gpu_blocks: int, num_cpu_blocks: int, block_size: int, num_kv_heads: int,
        head_dim: int, dtype: torch.dtype, layout: str, device: str,
    ) -> None:
        if layout == "NHD":
            block_shape = (2, block_size, num_kv_heads, head_dim)
        else:
            block_shape = (2, num_kv_heads, block_size, head_dim)
        self.device = device
        self.gpu_cache = [torch.zeros((num_gpu_blocks,) + block_shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.cpu_cache = [torch.zeros((num_cpu_blocks,) + block_shape, dtype=dtype, pin_memory=True) for _ in range(num_layers)]
        self.swap_stream = torch.cuda.Stream()
        self.swap_out_done = torch.cuda.Event()
        self.swap_in_done = torch.cuda.Event()

    def swap_out(self, pairs: List[Tuple[int, int]]) -> None:
        """GPU -> pinned CPU, one async memcpy per block and layer on the swap stream."""
        self.swap_stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.swap_stream):
            for gpu, cpu in zip(self.gpu_cache, self.cpu_cache):
                for g, c in pairs:
                    cpu[c].copy_(gpu[g], non_blocking=True)  # ok: FC101
            self.swap_out_done.record()
        # the freed GPU blocks may be handed to other sequences in this very step: order their next writes
        # after the copies that read them, on the device
        torch.cuda.current_stream().wait_event(self.swap_out_done)  # ok: FC101

    def swap_in(self, pairs: List[Tuple[int, int]]) -> None:
        """Pinned CPU -> GPU for sequences resumed this step."""
        self.swap_stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.swap_stream):
            for gpu, cpu in zip(self.gpu_cache, self.cpu_cache):
                for c, g in pairs:
                    gpu[g].copy_(cpu[c], non_blocking=True)
            self.swap_in_done.record()
        self.swap_in_done.synchronize()  # expect: FC101

    def copy_blocks(self, pairs: List[Tuple[int, int]]) -> None:
        src = torch.tensor([s for s, _ in pairs], dtype=torch.int64, device=self.device)
        dst = torch.tensor([d for _, d in pairs], dtype=torch.int64, device=self.device)
        for gpu in self.gpu_cache:
            gpu.index_copy_(0, dst, gpu.index_select(0, src))


@dataclass
class AttnContext:
    batch_indices: torch.Tensor
    positions: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len: torch.Tensor
    graph_bs: Optional[int] = None


class SwapAttention(nn.Module):
    def __init__(self, cfg, backend: FlashInferDecodeBackend) -> None:
        super().__init__()
        self.backend = backend
        self.nh, self.nkv, self.hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.qkv = nn.Linear(cfg.hidden_size, (self.nh + 2 * self.nkv) * self.hd, bias=False)
        self.o_proj = nn.Linear(self.nh * self.hd, cfg.hidden_size, bias=False)

    def _qkv(self, h: torch.Tensor, ctx: AttnContext, kv_cache: torch.Tensor):
        q, k, v = self.qkv(h).split([self.nh * self.hd, self.nkv * self.hd, self.nkv * self.hd], dim=-1)
        q = q.view(-1, self.nh, self.hd)
        k = k.view(-1, self.nkv, self.hd)
        v = v.view(-1, self.nkv, self.hd)
        apply_rope_pos_ids_inplace(q, k, ctx.positions)
        append_paged_kv_cache(
            k, v, ctx.batch_indices, ctx.positions, kv_cache, ctx.kv_indices, ctx.kv_indptr, ctx.kv_last_page_len
        )
        return q

    def decode(self, h: torch.Tensor, kv_cache: torch.Tensor, ctx: AttnContext) -> torch.Tensor:
        q = self._qkv(h, ctx, kv_cache)
        return self.o_proj(self.backend.forward_decode(q, kv_cache, ctx.graph_bs).flatten(1))

    def prefill(self, h: torch.Tensor, kv_cache: torch.Tensor, ctx: AttnContext) -> torch.Tensor:
        q = self._qkv(h, ctx, kv_cache)
        return self.o_proj(self.backend.forward_prefill(q, kv_cache).flatten(1))


class SwapModel(nn.Module):
    def __init__(self, cfg, backend: FlashInferDecodeBackend) -> None:
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.attn = nn.ModuleList([SwapAttention(cfg, backend) for _ in range(cfg.num_layers)])
        self.mlp = nn.ModuleList(
            [nn.Sequential(nn.Linear(cfg.hidden_size, cfg.ffn), nn.GELU(), nn.Linear(cfg.ffn, cfg.hidden_size)) for _ in range(cfg.num_layers)]
        )
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def decode(self, input_ids, positions, kv_caches: List[torch.Tensor], ctx: AttnContext) -> torch.Tensor:
        h = self.embed(input_ids)
        for attn, mlp, kv in zip(self.attn, self.mlp, kv_caches):
            h = h + attn.decode(h, kv, ctx)
            h = h + mlp(h)
        return self.lm_head(h)

    def prefill(self, input_ids, positions, kv_caches: List[torch.Tensor], ctx: AttnContext) -> torch.Tensor:
        h = self.embed(input_ids)
        for attn, mlp, kv in zip(self.attn, self.mlp, kv_caches):
            h = h + attn.prefill(h, kv, ctx)
            h = h + mlp(h)
        return self.lm_head(h)
