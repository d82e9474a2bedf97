"""The DSA engine loop: admit, prefill, index, decode (graph or eager), emit."""

from __future__ import annotations

import collections
import logging
from typing import Deque, List, Optional

import torch

from dsa.batch import DecodeBatch, ExtendBatch, Request
from dsa.config import DSAConfig
from dsa.indexer import LightningIndexer
from dsa.kv_cache import MLATokenPool
from dsa.sparse_pages import SparseIndexBuilder
from dsa_attn.backend import DSAAttnBackend
from dsa_attn.graph_runner import SparseGraphRunner
from dsa_attn.model import DSAModel

logger = logging.getLogger(__name__)


class SparseDecodeEngine:
    def __init__(self, cfg: DSAConfig, num_pages: int, device: str = "cuda", use_graphs: bool = True):
        self.cfg = cfg
        self.device = torch.device(device)
        major, _ = torch.cuda.get_device_capability(self.device)
        self.pool = MLATokenPool(cfg, num_pages, self.device)
        self.backend = DSAAttnBackend(cfg, self.pool, self.device, use_trtllm_dense=major >= 10)
        self.builder = SparseIndexBuilder(cfg, self.device)
        self.model = DSAModel(cfg, self.backend, self.pool).to(self.device)
        self.indexer = LightningIndexer(cfg, self.pool, self.builder, self.backend.kv_indices_buf).to(self.device)
        self.runner: Optional[SparseGraphRunner] = None
        if use_graphs:
            self.runner = SparseGraphRunner(cfg, self.model, self.backend, self.builder, self.device)
            self.runner.capture()
        logger.info("workspaces: %s", self.backend.workspace_report())
        self.waiting: Deque[Request] = collections.deque()
        self.running: List[Request] = []
        self._free_slots = list(range(cfg.max_batch_size - 1, -1, -1))
        self._next_rid = 0

    def add_request(self, prompt_ids: List[int], max_new_tokens: int = 256) -> int:
        if len(prompt_ids) < 2:
            raise ValueError("prompts need at least two tokens (the last one starts decoding)")
        rid = self._next_rid
        self._next_rid += 1
        self.waiting.append(Request(rid=rid, pool_idx=-1, prompt_ids=list(prompt_ids), max_new_tokens=max_new_tokens))
        return rid

    def _admit(self) -> List[Request]:
        admitted = []
        while self.waiting and self._free_slots and len(self.running) + len(admitted) < self.cfg.max_batch_size:
            req = self.waiting.popleft()
            req.pool_idx = self._free_slots.pop()
            admitted.append(req)
        return admitted

    def _prefill(self, reqs: List[Request]) -> None:
        eb = ExtendBatch.from_requests(reqs, self.pool, self.device)
        self.backend.init_forward_metadata_extend(eb)
        self.model.forward_extend(eb)
        # indexer keys come from the embeddings, as in decode
        self.indexer.write_keys(eb.out_cache_loc, self.model.embed(eb.input_ids))
        self.running.extend(reqs)

    def step(self) -> Optional[torch.Tensor]:
        admitted = self._admit()
        if admitted:
            self._prefill(admitted)
        if not self.running:
            return None
        fb = DecodeBatch.from_requests(self.running, self.cfg.index_topk, self.pool, self.device)
        layout = self.builder.layout(fb.seq_lens_cpu.numpy())
        h0 = self.model.embed(fb.input_ids)
        self.indexer.write_keys(fb.out_cache_loc, h0)
        bucket = self.runner.bucket_for(layout.bs) if self.runner is not None else None
        self.indexer.select_topk(h0, fb, layout, padded=bucket is not None)
        if bucket is not None:
            logits = self.runner.replay(fb, layout)
        else:
            self.backend.init_forward_metadata(fb, layout)
            logits = self.model.forward_decode(fb)
        return torch.argmax(logits, dim=-1)

    def _emit(self, next_ids: torch.Tensor) -> None:
        still: List[Request] = []
        for req, tok in zip(self.running, next_ids.tolist()):  # ok: FC101
            req.output_ids.append(tok)
            if req.finished:
                self.pool.release(req.pool_idx)
                self._free_slots.append(req.pool_idx)
            else:
                still.append(req)
        self.running = still

    def serve_forever(self) -> None:
        while self.running or self.waiting:
            next_ids = self.step()
            if next_ids is not None:
                self._emit(next_ids)
