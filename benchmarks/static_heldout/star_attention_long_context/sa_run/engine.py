"""The Star Attention server loop of one host."""

import logging
from typing import List, Optional

import numpy as np
import torch

from staratt import ContextLayout, StarConfig, split_context
from sa_attn.backend import StarAttentionBackend
from sa_attn.metadata import StepBatch
from sa_run.model import StarDecoder
from sa_run.runner import StarGraphRunner

logger = logging.getLogger(__name__)


class StarEngine:
    def __init__(self, cfg: StarConfig, local_rank: int):
        self.cfg = cfg
        self.device = torch.device("cuda", local_rank)
        self.backend = StarAttentionBackend(cfg, self.device)
        self.model = StarDecoder(cfg, self.backend, self.device)
        self.runner = StarGraphRunner(self.model, self.backend, cfg.decode_buckets)
        self.layout: Optional[ContextLayout] = None
        self.last_hidden: Optional[torch.Tensor] = None
        self.steps = 0

    def start(self) -> None:
        self.runner.capture_all()

    def encode_context(self, prompt_ids: List[int]) -> ContextLayout:
        c = self.cfg
        layout = split_context(
            len(prompt_ids), c.block_tokens, c.anchor_tokens, c.page_size, c.host_rank, c.num_hosts, self.device
        )
        self.backend.plan_context_blocks(layout, layout.anchor_len)
        self.layout = layout
        return layout

    def make_batch(self, ids: np.ndarray, positions: np.ndarray, seq_lens: np.ndarray, page_counts: np.ndarray,
                   kv_indices: torch.Tensor, context_len: int) -> StepBatch:
        if self.layout is None:
            raise RuntimeError("encode_context() must run before the query phase")
        return StepBatch(
            batch_size=len(seq_lens),
            context_len=context_len,
            input_ids=torch.as_tensor(ids, device=self.device),
            positions=torch.as_tensor(positions, device=self.device),
            query_lens=torch.ones(len(seq_lens), dtype=torch.int32, device=self.device),
            kv_indices=kv_indices,
            kv_page_counts_cpu=page_counts,
            seq_lens_cpu=seq_lens,
            layout=self.layout,
        )

    def step(self, batch: StepBatch) -> torch.Tensor:
        self.steps += 1
        if self.runner.bucket_for(batch.batch_size) is not None:
            h = self.runner.replay(batch)
        else:
            self.backend.init_forward_metadata(batch)
            h = self.model.forward_decode(batch.input_ids, batch.positions, batch.batch_size)
        self.last_hidden = h
        return h

    def relocate_anchor(self, anchor_pages: torch.Tensor) -> None:
        self.backend.rebase_anchor(anchor_pages, anchor_pages.numel())

    def describe_step(self) -> str:
        if self.last_hidden is None:
            return "idle"
        peak = self.last_hidden.abs().amax().item()  # ok: FC101
        return f"steps={self.steps} peak={peak:.3f}"

    def report_stats(self) -> None:
        logger.info("star engine: %s ws=%s", self.describe_step(), self.backend.workspace_bytes())
