"""The engine: picks its backend chain at start-up and a backend every step."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List

import numpy as np
import torch

import flashcheck
from fb_backends.fa2 import FlashInferFA2Backend
from fb_backends.torch_ref import TorchFallbackBackend
from fb_backends.trtllm_gen import TrtllmGenBackend
from fb_backends.base import StepInputs
from fb_engine.graphs import DecodeGraphs
from fb_engine.model import ChainModel
from fbchain.capability import detect_caps
from fbchain.config import ChainConfig
from fbchain.selector import BackendChain

DEFAULT_CHAIN = (TrtllmGenBackend, FlashInferFA2Backend, TorchFallbackBackend)


@dataclass
class ScheduledReq:
    token_ids: List[int]
    num_computed: int
    pages: List[int]


class Engine:
    def __init__(self, cfg: ChainConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.caps = detect_caps(device)
        shape = (cfg.num_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim)
        self.kv_caches = [torch.zeros(shape, dtype=cfg.dtype, device=device) for _ in range(cfg.num_layers)]
        self.model = ChainModel(cfg, self.kv_caches).to(device=device, dtype=cfg.dtype)
        self.chain = BackendChain(cfg, self.caps, device, DEFAULT_CHAIN)
        self.graphs = None
        if "fa2" in self.chain.order:
            fa2 = self.chain.get("fa2")
            self.graphs = DecodeGraphs(cfg, fa2, self.model, device)
        if "torch" in self.chain.order and self.graphs is not None:
            # the fallback borrows the graphs' index buffer instead of holding a pool-sized one
            self.chain.put(TorchFallbackBackend(cfg, self.caps, device, scratch_indices=self.graphs.indices))
        mb, mt = cfg.max_num_seqs, cfg.max_num_tokens
        self._seq_lens_host = torch.zeros(mb, dtype=torch.int32, pin_memory=True)
        self._qo_indptr_host = torch.zeros(mb + 1, dtype=torch.int32, pin_memory=True)
        self._kv_indptr_host = torch.zeros(mb + 1, dtype=torch.int32, pin_memory=True)
        self._last_page_host = torch.ones(mb, dtype=torch.int32, pin_memory=True)
        self.input_ids = torch.zeros(mt, dtype=torch.int64, device=device)
        self.positions = torch.zeros(mt, dtype=torch.int64, device=device)
        self.slot_mapping = torch.zeros(mt, dtype=torch.int64, device=device)
        self.seq_lens = torch.zeros(mb, dtype=torch.int32, device=device)
        self.qo_indptr = torch.zeros(mb + 1, dtype=torch.int32, device=device)
        self.kv_indptr = torch.zeros(mb + 1, dtype=torch.int32, device=device)
        self.kv_indices = torch.zeros(cfg.num_pages, dtype=torch.int32, device=device)
        self.block_table = torch.zeros((mb, cfg.max_model_len // cfg.page_size), dtype=torch.int32, device=device)

    def _prepare(self, reqs: List[ScheduledReq]) -> StepInputs:
        cfg, page = self.cfg, self.cfg.page_size
        n = len(reqs)
        if self._seq_lens_host.numel() < n:
            self._seq_lens_host = torch.empty(2 * n, dtype=torch.int32, pin_memory=True)  # ok: FC107
        q_lens = np.array([len(r.token_ids) for r in reqs], dtype=np.int32)
        seq_lens = np.array([r.num_computed + len(r.token_ids) for r in reqs], dtype=np.int32)
        num_pages = (seq_lens + page - 1) // page
        qo = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
        kvp = np.concatenate([[0], np.cumsum(num_pages)]).astype(np.int32)
        total, nnz = int(qo[-1]), int(kvp[-1])
        ids = np.concatenate([np.asarray(r.token_ids, dtype=np.int64) for r in reqs])
        pos = np.concatenate([np.arange(r.num_computed, r.num_computed + len(r.token_ids)) for r in reqs])
        pages_flat = np.concatenate([np.asarray(r.pages[:k], dtype=np.int32) for r, k in zip(reqs, num_pages)])
        row_of_tok = np.repeat(np.arange(n), q_lens)
        slots = pages_flat[kvp[row_of_tok] + pos // page].astype(np.int64) * page + pos % page
        self._seq_lens_host[:n] = torch.from_numpy(seq_lens)
        self._qo_indptr_host[: n + 1] = torch.from_numpy(qo)
        self._kv_indptr_host[: n + 1] = torch.from_numpy(kvp)
        self._last_page_host[:n] = torch.from_numpy(((seq_lens - 1) % page + 1).astype(np.int32))
        table = np.zeros((n, self.block_table.shape[1]), dtype=np.int32)
        for i, r in enumerate(reqs):
            table[i, : num_pages[i]] = r.pages[: num_pages[i]]
        self.input_ids[:total].copy_(torch.from_numpy(ids), non_blocking=True)
        self.positions[:total].copy_(torch.from_numpy(pos), non_blocking=True)
        self.slot_mapping[:total].copy_(torch.from_numpy(slots), non_blocking=True)
        self.seq_lens[:n].copy_(self._seq_lens_host[:n], non_blocking=True)
        self.qo_indptr[: n + 1].copy_(self._qo_indptr_host[: n + 1], non_blocking=True)
        self.kv_indptr[: n + 1].copy_(self._kv_indptr_host[: n + 1], non_blocking=True)
        self.kv_indices[:nnz].copy_(torch.from_numpy(pages_flat), non_blocking=True)
        self.block_table[:n].copy_(torch.from_numpy(table), non_blocking=True)
        return StepInputs(
            num_reqs=n,
            num_tokens=total,
            is_decode=bool((q_lens == 1).all()),
            input_ids=self.input_ids[:total],
            positions=self.positions[:total],
            slot_mapping=self.slot_mapping[:total],
            seq_lens=self.seq_lens[:n],
            seq_lens_cpu=self._seq_lens_host[:n],
            qo_indptr=self.qo_indptr[: n + 1],
            qo_indptr_cpu=self._qo_indptr_host[: n + 1],
            kv_indptr=self.kv_indptr[: n + 1],
            kv_indptr_cpu=self._kv_indptr_host[: n + 1],
            kv_indices=self.kv_indices[:nnz],
            kv_last_page_len_cpu=self._last_page_host[:n],
            block_table=self.block_table[:n],
            window_layers=cfg.window_layers,
        )

    @flashcheck.hot_path
    def step(self, reqs: List[ScheduledReq]) -> torch.Tensor:
        inputs = self._prepare(reqs)
        backend = self.chain.select_for_step(inputs)
        if inputs.is_decode and self.graphs is not None and self.graphs.can_run(inputs, backend):
            logits = self.graphs.replay(inputs)
        else:
            backend.plan(inputs)
            logits = self.model(inputs, backend)
        last = self.qo_indptr[1 : inputs.num_reqs + 1] - 1
        return logits[last].argmax(dim=-1)
