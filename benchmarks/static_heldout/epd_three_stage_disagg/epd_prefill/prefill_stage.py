"""The prefill stage: merges encoder rows into the prompt, prefills, ships the KV pages."""

from typing import Dict, List, Tuple

import numpy as np
import torch
from torch import nn

from epd.config import EPDConfig
from epd.protocol import EmbeddingHandle, KVPageHandle
from epd.transfer import TransferEngine
from epd_encoder.embed_cache import EmbeddingCache
from epd_prefill.prefill_attn import PrefillAttnBackend, PrefillBatch


@torch.jit.script
def scatter_mm_embeds(text_embeds: torch.Tensor, mm_embeds: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    assert mm_embeds.size(0) == dst.size(0), "encoder rows and image tokens disagree"  # ok: FC109
    return text_embeds.index_copy(0, dst, mm_embeds)


class PrefillLayer(nn.Module):
    def __init__(self, cfg: EPDConfig, backend: PrefillAttnBackend) -> None:
        super().__init__()
        self.backend = backend
        self.h, self.kvh, self.d = cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim
        self.qkv = nn.Linear(cfg.hidden_size, (self.h + 2 * self.kvh) * self.d)
        self.o = nn.Linear(self.h * self.d, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, kv_cache: torch.Tensor, fb: PrefillBatch) -> torch.Tensor:
        q, k, v = self.qkv(x).split([self.h * self.d, self.kvh * self.d, self.kvh * self.d], dim=-1)
        o = self.backend.forward(
            q.view(-1, self.h, self.d), k.view(-1, self.kvh, self.d), v.view(-1, self.kvh, self.d), kv_cache, fb
        )
        return x + self.o(o.reshape(x.shape[0], -1))


class PrefillStage:
    def __init__(self, cfg: EPDConfig, transfer: TransferEngine, encoder_cache: EmbeddingCache) -> None:
        self.cfg = cfg
        self.device = cfg.device
        self.transfer = transfer
        self.encoder_cache = encoder_cache
        self.backend = PrefillAttnBackend(cfg)
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size).to(cfg.device)
        self.layers = nn.ModuleList([PrefillLayer(cfg, self.backend) for _ in range(cfg.num_layers)]).to(cfg.device)
        self.kv_caches = [
            torch.zeros(cfg.num_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim, dtype=torch.bfloat16, device=cfg.device)
            for _ in range(cfg.num_layers)
        ]

    def make_batch(self, prompts: List[List[int]], pages: List[List[int]], prefix_lens: List[int]) -> PrefillBatch:
        page = self.cfg.page_size
        q_lens = np.array([len(p) for p in prompts], dtype=np.int32)
        kv_lens = q_lens + np.array(prefix_lens, dtype=np.int32)
        n_pages = (kv_lens + page - 1) // page
        qo = np.zeros(len(prompts) + 1, dtype=np.int32)
        np.cumsum(q_lens, out=qo[1:])
        kv = np.zeros(len(prompts) + 1, dtype=np.int32)
        np.cumsum(n_pages, out=kv[1:])
        ids_np = np.concatenate([np.asarray(p, dtype=np.int64) for p in prompts])
        idx_np = np.concatenate([np.asarray(pg[:n], dtype=np.int32) for pg, n in zip(pages, n_pages)])
        return PrefillBatch(
            input_ids=torch.from_numpy(ids_np).to(self.device, non_blocking=True),
            input_ids_np=ids_np,
            qo_indptr=torch.from_numpy(qo).to(self.device, non_blocking=True),
            kv_indptr_cpu=torch.from_numpy(kv),
            kv_indices=torch.from_numpy(idx_np).to(self.device, non_blocking=True),
            kv_last_page_len_cpu=torch.from_numpy((kv_lens - (n_pages - 1) * page).astype(np.int32)),
            cu_seqlens_list=qo.tolist(),
            has_prefix=any(prefix_lens),
        )

    @torch.inference_mode()
    def run(self, fb: PrefillBatch, handles: List[EmbeddingHandle]) -> torch.Tensor:
        self.backend.init_forward_metadata(fb)
        x = self.embed(fb.input_ids)
        if handles:
            rows = torch.cat([self.encoder_cache.rows(h.start_row, h.num_rows) for h in handles])
            x = scatter_mm_embeds(x, rows.to(x.dtype), fb.mm_dst)
        for layer, kv in zip(self.layers, self.kv_caches):
            x = layer(x, kv, fb)
        return x

    def ship(self, req_ids: List[str], pages: List[List[int]], seq_lens: List[int],
             dst_start: Dict[str, int], dst_caches: List[torch.Tensor]) -> List[KVPageHandle]:
        """Copy each request's pages into the contiguous range the decode stage reserved for it."""
        out: List[KVPageHandle] = []
        for req_id, pg, n in zip(req_ids, pages, seq_lens):
            src = torch.tensor(pg, dtype=torch.long, device=self.device)
            start = dst_start[req_id]
            ticket = None
            for kv_src, kv_dst in zip(self.kv_caches, dst_caches):
                ticket = self.transfer.send(kv_src.index_select(0, src), kv_dst[start : start + len(pg)])
            page_ids = torch.arange(start, start + len(pg), dtype=torch.int32, device=self.device)
            out.append(KVPageHandle(req_id, "NHD", n, page_ids, ticket=ticket))
        return out

    def pending(self) -> Tuple[int, int]:
        return len(self.kv_caches), self.cfg.page_size
