from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import List

import numpy as np
import torch

from bisrv.determinism import DeterminismConfig
from bisrv.forward_batch import ForwardBatch, ForwardMode
from bisrv.graph_runner import CudaGraphRunner
from bisrv.layers.attention_backend import FixedSplitFlashInferBackend
from bisrv.memory_pool import ReqToTokenPool, TokenToKVPool
from bisrv.model import InvariantLlama
from bisrv.sampling.seeded import SeededSampler

logger = logging.getLogger(__name__)


@dataclass
class ScheduledReq:
    rid: str
    req_pool_idx: int
    seq_len: int  # after this step
    new_tokens: List[int]
    new_slots: List[int]
    seed: int
    step: int
    temperature: float


class ModelRunner:
    def __init__(self, det: DeterminismConfig, device: str = "cuda", dtype=torch.bfloat16):
        self.det = det
        self.device = torch.device(device)
        self.dtype = dtype
        self.req_to_token_pool = ReqToTokenPool(det.max_batch_size * 2, det.max_context_len, self.device)
        self.token_to_kv_pool = TokenToKVPool(
            det.max_total_tokens, det.num_layers, det.num_kv_heads, det.head_dim, dtype, self.device
        )
        self.sampler = SeededSampler(det.vocab_size)
        self.model = InvariantLlama(det, self.device, dtype)
        self.attn_backend = FixedSplitFlashInferBackend(self)
        self.graph_runner = CudaGraphRunner(self)

    def _h2d(self, a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(a).pin_memory().to(self.device, non_blocking=True)

    def make_batch(self, reqs: List[ScheduledReq], mode: ForwardMode) -> ForwardBatch:
        bs = len(reqs)
        ext = np.asarray([len(r.new_tokens) for r in reqs], dtype=np.int32)
        lens = np.asarray([r.seq_len for r in reqs], dtype=np.int32)
        positions = np.concatenate([np.arange(r.seq_len - len(r.new_tokens), r.seq_len) for r in reqs])
        ids = np.concatenate([np.asarray(r.new_tokens, dtype=np.int64) for r in reqs])
        slots = np.concatenate([np.asarray(r.new_slots, dtype=np.int64) for r in reqs])

        return ForwardBatch(
            forward_mode=mode,
            batch_size=bs,
            attn_backend=self.attn_backend,
            input_ids=self._h2d(ids),
            positions=self._h2d(positions.astype(np.int64)),
            req_pool_indices=self._h2d(np.asarray([r.req_pool_idx for r in reqs], dtype=np.int32)),
            seq_lens=self._h2d(lens),
            seq_lens_np=lens,
            out_cache_loc=self._h2d(slots),
            seeds=self._h2d(np.asarray([r.seed for r in reqs], dtype=np.int64)),
            sampling_steps=self._h2d(np.asarray([r.step for r in reqs], dtype=np.int64)),
            temperatures=self._h2d(np.asarray([r.temperature for r in reqs], dtype=np.float32)),
            seed_list=[r.seed for r in reqs],
            extend_lens=self._h2d(ext) if mode.is_extend() else None,
            extend_lens_np=ext,
            extend_num_tokens=int(ext.sum()),
        )

    def forward(self, fb: ForwardBatch) -> torch.Tensor:
        if fb.forward_mode.is_decode() and fb.batch_size <= self.graph_runner.max_bs:
            ids = self.graph_runner.replay(fb)
            self._prefetch_next_indptr(fb)
            return ids
        self.attn_backend.init_forward_metadata(fb)
        if fb.forward_mode.is_decode():
            logits = self.model.forward_decode(fb.input_ids, fb.positions, fb)
        else:
            logits = self.model.forward_extend(fb.input_ids, fb.positions, fb)
        return self.sampler.sample(logits, fb)

    def _prefetch_next_indptr(self, fb: ForwardBatch) -> None:
        """Overlap: next step's lengths are this step's plus one; build the graph indptr while the GPU is busy."""
        n = fb.batch_size
        torch.cumsum(fb.seq_lens + 1, 0, dtype=torch.int32, out=self.attn_backend.cuda_graph_kv_indptr[1 : n + 1])  # expect: FC104
