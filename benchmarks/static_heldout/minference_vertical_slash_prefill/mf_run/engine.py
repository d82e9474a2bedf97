"""A small long-context engine: sparse prefill for long prompts, graph decode for the rest."""

from typing import Dict, List, Optional

import numpy as np
import torch

from mfserve import MInferenceConfig
from mf_attn.backend import MInferenceBackend
from mf_attn.metadata import MInferenceMetadataBuilder, StepBatch
from mf_run.graph_runner import DecodeGraphRunner
from mf_run.model import MInferenceLM


class MInferenceEngine:
    def __init__(self, cfg: MInferenceConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.backend = MInferenceBackend(cfg, device)
        self.backend.init_graph_wrappers()
        self.builder = MInferenceMetadataBuilder(cfg, device)
        self.model = MInferenceLM(cfg, self.backend, device)
        self.runner = DecodeGraphRunner(self.model, self.backend, cfg, device)
        self.page_table_np = np.zeros((cfg.max_batch, cfg.max_pages_per_seq), dtype=np.int32)
        self.seq_lens_np = np.zeros(cfg.max_batch, dtype=np.int64)
        self.free_pages: List[int] = list(range(cfg.max_pages))
        self.row_of: Dict[int, int] = {}

    def warm_up_graphs(self) -> None:
        for bs in sorted(self.cfg.decode_buckets, reverse=True):
            self.runner.capture_one_batch_size(bs)

    def _grow_pages(self, row: int, new_len: int) -> np.ndarray:
        ps = self.cfg.page_size
        have = (int(self.seq_lens_np[row]) + ps - 1) // ps
        need = (new_len + ps - 1) // ps
        fresh = [self.free_pages.pop() for _ in range(need - have)]
        self.page_table_np[row, have:need] = fresh
        self.seq_lens_np[row] = new_len
        return np.asarray(fresh, dtype=np.int32)

    def _batch(
        self, rows: List[int], ids_np: np.ndarray, pos_np: np.ndarray, is_prefill: bool,
        extend_lens_np: Optional[np.ndarray] = None,
    ) -> StepBatch:
        lens = self.seq_lens_np[rows].copy()
        long_np = np.flatnonzero(lens > self.cfg.long_ctx_len)
        return StepBatch(
            is_prefill=is_prefill,
            batch_size=len(rows),
            input_ids=torch.from_numpy(ids_np).to(self.device, non_blocking=True),
            positions=torch.from_numpy(pos_np).to(self.device, non_blocking=True),
            seq_lens=torch.from_numpy(lens).to(self.device, non_blocking=True),
            seq_lens_np=lens,
            page_table_np=self.page_table_np[rows],
            extend_lens_np=extend_lens_np,
            long_rows=torch.from_numpy(long_np).to(self.device, non_blocking=True),
        )

    def prefill(self, req_ids: List[int], prompts: List[np.ndarray]) -> torch.Tensor:
        rows, new_pages = [], []
        for rid, prompt in zip(req_ids, prompts):
            row = self.row_of.setdefault(rid, len(self.row_of))
            rows.append(row)
            new_pages.append(self._grow_pages(row, len(prompt)))
        ids_np = np.concatenate(prompts).astype(np.int64)
        pos_np = np.concatenate([np.arange(len(p)) for p in prompts]).astype(np.int64)
        ext = np.asarray([len(p) for p in prompts], dtype=np.int64)
        fb = self._batch(rows, ids_np, pos_np, True, ext)
        meta = self.builder.build(fb)
        self.backend.init_forward_metadata(fb, meta)
        pages = torch.from_numpy(np.concatenate(new_pages)).to(self.device, non_blocking=True)
        logits = self.model.forward_prefill(fb, meta, pages)
        return torch.argmax(logits, dim=-1)

    def decode_step(self, req_ids: List[int], last_tokens: np.ndarray) -> torch.Tensor:
        rows = [self.row_of[r] for r in req_ids]
        pos_np = self.seq_lens_np[rows].copy()
        for row in rows:
            self._grow_pages(row, int(self.seq_lens_np[row]) + 1)
        fb = self._batch(rows, last_tokens.astype(np.int64), pos_np, False)
        if len(rows) <= max(self.cfg.decode_buckets):
            logits = self.runner.replay(fb)
        else:
            meta = self.builder.build(fb)
            self.backend.init_forward_metadata(fb, meta)
            logits = self.model.forward_decode(fb)
        return torch.argmax(logits, dim=-1)

    def debug_dump(self) -> dict:
        return self.backend.estimator.dump_patterns()
