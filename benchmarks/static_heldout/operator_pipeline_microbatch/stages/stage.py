"""A pipeline stage: a contiguous slice of decoder layers sharing one StageAttention."""
import dataclasses
from typing import List, Optional

import torch
from flashinfer.rope import apply_rope_pos_ids
from torch import nn

from ppengine.config import PAGE_SIZE, PipelineConfig
from stages.attention import StageAttention


@dataclasses.dataclass
class StageMeta:
    slot: int
    num_reqs: int
    bucket: Optional[int]
    graph: bool
    seq_lens: torch.Tensor
    positions: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_last_page_len_cpu: torch.Tensor
    qo_indptr_cpu: torch.Tensor
    qo_indptr: Optional[torch.Tensor] = None
    is_prefill: bool = False
    no_prefix: bool = False
    block_tables: Optional[torch.Tensor] = None
    max_seq_len: int = 0


class PipelineStage(nn.Module):
    """Layers [stage_id * L, (stage_id + 1) * L); K/V reach the paged cache in the qkv GEMM's epilogue."""
    def __init__(self, cfg: PipelineConfig, stage_id: int, kv_caches: List[torch.Tensor]):
        super().__init__()
        self.stage_id, self.kv_caches, self.is_last = stage_id, kv_caches, stage_id == cfg.num_stages - 1
        self.attn = StageAttention(cfg, stage_id)
        self.heads = (cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim)
        self.split = (cfg.num_qo_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim)
        self._sm_scale = cfg.head_dim**-0.5
        layer_ids = range(stage_id * cfg.layers_per_stage, (stage_id + 1) * cfg.layers_per_stage)
        self.windowed = [i in cfg.window_layers for i in layer_ids]
        kw = dict(bias=False, device=cfg.device, dtype=torch.bfloat16)
        self.qkv = nn.ModuleList(nn.Linear(cfg.hidden_size, sum(self.split), **kw) for _ in layer_ids)
        self.o_proj = nn.ModuleList(nn.Linear(self.split[0], cfg.hidden_size, **kw) for _ in layer_ids)

    def _qkv(self, i: int, hidden: torch.Tensor, positions: torch.Tensor):
        hq, hk, d = self.heads
        q, k, v = self.qkv[i](hidden).split(self.split, dim=-1)
        q, k = apply_rope_pos_ids(q.view(-1, hq, d), k.view(-1, hk, d), positions)
        return q, k, v.view(-1, hk, d)

    def forward(self, hidden: torch.Tensor, meta: StageMeta) -> torch.Tensor:
        return self.forward_extend(hidden, meta) if meta.is_prefill else self.forward_decode(hidden, meta)

    def forward_decode(self, hidden: torch.Tensor, meta: StageMeta) -> torch.Tensor:
        for i, kv in enumerate(self.kv_caches):
            q, _, _ = self._qkv(i, hidden, meta.positions)
            hidden = hidden + self.o_proj[i](self.attn.decode(q, kv, meta, self.windowed[i]).flatten(1))
        if self.is_last and meta.graph:
            # The next step decodes one more token: advance the last-page lengths inside the graph.
            meta.kv_last_page_len.copy_(meta.kv_last_page_len % PAGE_SIZE + 1)  # expect: FC104
        return hidden

    def forward_extend(self, hidden: torch.Tensor, meta: StageMeta) -> torch.Tensor:
        hidden = hidden[: meta.qo_indptr[-1]]  # expect: FC101
        for i, kv in enumerate(self.kv_caches):
            q, k, v = self._qkv(i, hidden, meta.positions)
            hidden = hidden + self.o_proj[i](self.attn.extend(q, k, v, kv, meta).flatten(1))
        return hidden[meta.qo_indptr[1:] - 1] if self.is_last else hidden  # ok: FC101
