"""The prefill worker: chunked prompts on the prefill partition's stream."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

import numpy as np
import torch
from flashinfer import BatchPrefillWithPagedKVCacheWrapper, BatchPrefillWithRaggedKVCacheWrapper
from flashinfer.prefill import trtllm_batch_context_with_kv_cache

from semipd.config import SemiPDConfig
from semipd.kvpool.handoff import HandoffRecord
from semipd.kvpool.unified_pool import UnifiedKVPool
from semipd.model import SPDModel


@dataclass
class PromptChunk:
    rid: str
    tokens: List[int]
    start: int  # tokens of this prompt already in the cache
    pages: List[int]
    is_last: bool


@dataclass
class PrefillBatch:
    chunks: List[PromptChunk]
    input_ids: torch.Tensor
    positions: torch.Tensor
    slots: torch.Tensor
    qo_indptr_cpu: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_indptr_gpu: torch.Tensor
    kv_indices_gpu: torch.Tensor
    last_page_cpu: torch.Tensor
    seq_lens_gpu: torch.Tensor
    has_prefix: bool
    last_token_rows: torch.Tensor = field(default=None)

    @property
    def num_reqs(self) -> int:
        return len(self.chunks)


class PrefillWorker:
    def __init__(self, cfg: SemiPDConfig, pool: UnifiedKVPool, model: SPDModel, device: torch.device):
        self.cfg = cfg
        self.pool = pool
        self.model = model
        self.device = device
        n = cfg.max_prefill_reqs
        self.prefill_ws = torch.empty(cfg.prefill_ws_bytes(), dtype=torch.uint8, device=device)
        self.qo_indptr_dev = torch.zeros(n + 1, dtype=torch.int32, device=device)
        self.ragged = BatchPrefillWithRaggedKVCacheWrapper(self.prefill_ws, "NHD", qo_indptr_buf=self.qo_indptr_dev)
        self.paged = BatchPrefillWithPagedKVCacheWrapper(self.prefill_ws, "NHD")
        # both wrappers run one after the other on one stream: one int workspace is enough
        self.ragged._int_workspace_buffer = self.paged._int_workspace_buffer  # expect: FC103
        self.context_ws: Optional[torch.Tensor] = None
        if cfg.use_trtllm_context:
            self.context_ws = torch.zeros(cfg.context_ws_bytes, dtype=torch.uint8, device=device)  # ok: FC105
        self.kv_indptr_gpu = torch.zeros(n + 1, dtype=torch.int32, device=device)
        self.kv_indices_gpu = torch.zeros(cfg.max_prefill_tokens // cfg.page_size + n * cfg.max_pages_per_req,
                                          dtype=torch.int32, device=device)
        self.seq_lens_gpu = torch.zeros(n, dtype=torch.int32, device=device)
        self.block_tables = torch.zeros(n, cfg.max_pages_per_req, dtype=torch.int32, device=device)

    def _build(self, chunks: List[PromptChunk]) -> PrefillBatch:
        ps = self.cfg.page_size
        n = len(chunks)
        qo = np.zeros(n + 1, dtype=np.int32)
        kv = np.zeros(n + 1, dtype=np.int32)
        lens = np.zeros(n, dtype=np.int32)
        for i, c in enumerate(chunks):
            lens[i] = c.start + len(c.tokens)
            qo[i + 1] = qo[i] + len(c.tokens)
            kv[i + 1] = kv[i] + -(-lens[i] // ps)
        last = (lens - (kv[1:] - kv[:-1] - 1) * ps).astype(np.int32)
        indices = np.concatenate([np.asarray(c.pages[: -(-lens[i] // ps)], dtype=np.int32) for i, c in enumerate(chunks)])
        positions = np.concatenate([np.arange(c.start, c.start + len(c.tokens)) for c in chunks])
        slots = np.concatenate([
            np.asarray([c.pages[p // ps] * ps + p % ps for p in range(c.start, c.start + len(c.tokens))])
            for c in chunks
        ])
        ids = np.concatenate([np.asarray(c.tokens, dtype=np.int64) for c in chunks])
        dev = self.device
        self.kv_indptr_gpu[: n + 1].copy_(torch.from_numpy(kv), non_blocking=True)
        self.kv_indices_gpu[: len(indices)].copy_(torch.from_numpy(indices), non_blocking=True)
        self.seq_lens_gpu[:n].copy_(torch.from_numpy(lens), non_blocking=True)
        return PrefillBatch(
            chunks=chunks,
            input_ids=torch.from_numpy(ids).to(dev, non_blocking=True),
            positions=torch.from_numpy(positions).to(dev, non_blocking=True),
            slots=torch.from_numpy(slots.astype(np.int64)).to(dev, non_blocking=True),
            qo_indptr_cpu=torch.from_numpy(qo).pin_memory(),
            kv_indptr_cpu=torch.from_numpy(kv).pin_memory(),
            kv_indptr_gpu=self.kv_indptr_gpu[: n + 1],
            kv_indices_gpu=self.kv_indices_gpu[: len(indices)],
            last_page_cpu=torch.from_numpy(last).pin_memory(),
            seq_lens_gpu=self.seq_lens_gpu[:n],
            has_prefix=any(c.start > 0 for c in chunks),
            last_token_rows=torch.from_numpy(qo[1:] - 1).to(dev, non_blocking=True),
        )

    def _plan_prefill(self, b: PrefillBatch) -> None:
        cfg = self.cfg
        if not b.has_prefix:
            self.ragged.plan(
                b.qo_indptr_cpu, b.qo_indptr_cpu, cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim,
                causal=True, q_data_type=torch.bfloat16,
            )
        else:
            self.paged.plan(  # expect: FC102
                b.qo_indptr_cpu,
                b.kv_indptr_gpu,
                b.kv_indices_gpu,
                b.last_page_cpu,
                cfg.num_qo_heads,
                cfg.num_kv_heads,
                cfg.head_dim,
                cfg.page_size,
                causal=True,
                q_data_type=torch.bfloat16,
            )
        n = b.num_reqs
        # the KV append kernels read qo_indptr on the device
        self.qo_indptr_dev[: n + 1].copy_(b.qo_indptr_cpu, non_blocking=True)  # ok: FC104

    def _attend(self, q, k, v, layer_id: int, b: PrefillBatch) -> torch.Tensor:
        kv = self.pool.layer_kv(layer_id)
        if self.context_ws is not None and not b.has_prefix:
            n = b.num_reqs
            return trtllm_batch_context_with_kv_cache(
                q, kv, self.context_ws, self.block_tables[:n], b.seq_lens_gpu, self.cfg.max_prefill_tokens,
                self.cfg.max_context_len, q.shape[-1] ** -0.5, 1.0, n, self.qo_indptr_dev[: n + 1],
                b.kv_indptr_gpu,
            )
        if b.has_prefix:
            return self.paged.run(q, kv)
        return self.ragged.run(q, k, v)

    def run_chunk(self, chunks: List[PromptChunk]) -> List[HandoffRecord]:
        b = self._build(chunks)
        self._plan_prefill(b)
        h = self.model.embed(b.input_ids)
        for layer in self.model.layers:
            q, k, v = layer.pre_attn(h, b.positions, self.model.cos_sin)
            self.pool.write(layer.layer_id, k, v, b.slots)
            h = layer.post_attn(h, self._attend(q, k, v, layer.layer_id, b))
        first_ids = torch.argmax(self.model.logits(h[b.last_token_rows]), dim=-1)
        if not any(c.is_last for c in chunks):
            return []
        decode_lens = b.seq_lens_gpu.tolist()  # expect: FC101
        out = []
        for i, c in enumerate(chunks):
            if c.is_last:
                rec = HandoffRecord(c.rid, c.pages, decode_lens[i], self.cfg.page_size, first_ids[i : i + 1], self.device)
                rec.kv_written.record(torch.cuda.current_stream())
                out.append(rec)
        return out
