"""Model runner: batches, eager and graph decode, expert rebalancing between steps."""

from __future__ import annotations

import logging
from typing import List

import numpy as np
import torch

from eplb.placement import ExpertPlacement
from eplb.rebalancer import EplbManager
from eplb.recorder import ExpertLoadRecorder
from srt_moe.config import MoEModelConfig, global_config
from srt_moe.cuda_graph_runner import CudaGraphRunner
from srt_moe.forward_batch import ForwardBatch, ForwardMode
from srt_moe.mla_backend import FlashInferMLABackend
from srt_moe.model import DeepseekLite

logger = logging.getLogger(__name__)


class ModelRunner:
    def __init__(self, cfg: MoEModelConfig, num_pages: int, device: str = "cuda") -> None:
        self.cfg = cfg
        self.device = torch.device(device)
        self.placement = ExpertPlacement(cfg.num_experts, cfg.num_physical_experts, cfg.ep_size)
        self.eplb_recorder = ExpertLoadRecorder(
            cfg.num_layers + 1, cfg.num_physical_experts, global_config.eplb_window_steps, self.device
        )
        self.attn_backend = FlashInferMLABackend(cfg, num_pages, self.device)
        self.model = DeepseekLite(cfg, self.attn_backend, self.placement, self.eplb_recorder, self.device).to(
            self.device, dtype=cfg.dtype
        )
        # the attention layers own the softmax scale (YaRN may have rescaled it)
        self.attn_backend.sm_scale = self.model.layers[0].self_attn._sm_scale  # ok: FC103
        self.eplb = EplbManager(
            self.placement, self.eplb_recorder, self.model.moe_layers(), global_config.eplb_rebalance_every
        )
        self.graph_runner = CudaGraphRunner(self)
        self.step = 0

    # --------------------------------------------------------------- batches

    def _slots(self, req_pages: List[np.ndarray], positions: np.ndarray, rows: np.ndarray) -> np.ndarray:
        p = self.cfg.page_size
        return np.array([int(req_pages[r][pos // p]) * p + int(pos % p) for r, pos in zip(rows, positions)], np.int64)

    def _table(self, req_pages: List[np.ndarray]) -> torch.Tensor:
        table = np.zeros((len(req_pages), self.cfg.max_pages_per_seq), dtype=np.int32)
        for i, pages in enumerate(req_pages):
            table[i, : pages.size] = pages
        return torch.from_numpy(table).to(self.device)

    def make_decode_batch(self, seq_lens: List[int], last_tokens: List[int], req_pages: List[np.ndarray]) -> ForwardBatch:
        lens = np.asarray(seq_lens, dtype=np.int32)
        positions = (lens - 1).astype(np.int64)
        slots = self._slots(req_pages, positions, np.arange(lens.size))
        longest = int(lens.max())
        return ForwardBatch(
            forward_mode=ForwardMode.DECODE,
            batch_size=lens.size,
            input_ids=torch.tensor(last_tokens, dtype=torch.int64, device=self.device),
            positions=torch.from_numpy(positions).to(self.device),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=self.device),
            seq_lens_cpu=torch.from_numpy(lens),
            out_cache_loc=torch.from_numpy(slots).to(self.device),
            req_pages=req_pages,
            block_table=self._table(req_pages),
            max_seq_len=longest,
            use_trtllm=longest > self.cfg.page_size * self.cfg.max_pages_per_seq // 2,
        )

    def make_extend_batch(self, prompts: List[List[int]], req_pages: List[np.ndarray]) -> ForwardBatch:
        lens = np.array([len(p) for p in prompts], dtype=np.int32)
        rows = np.repeat(np.arange(lens.size), lens)
        positions = np.concatenate([np.arange(n, dtype=np.int64) for n in lens])
        ids = np.concatenate([np.asarray(p, dtype=np.int64) for p in prompts])
        return ForwardBatch(
            forward_mode=ForwardMode.EXTEND,
            batch_size=lens.size,
            input_ids=torch.from_numpy(ids).to(self.device),
            positions=torch.from_numpy(positions).to(self.device),
            seq_lens=torch.from_numpy(lens).to(self.device),
            seq_lens_cpu=torch.from_numpy(lens),
            out_cache_loc=torch.from_numpy(self._slots(req_pages, positions, rows)).to(self.device),
            req_pages=req_pages,
            block_table=self._table(req_pages),
            max_seq_len=int(lens.max()),
            extend_seq_lens=torch.from_numpy(lens).to(self.device),
            extend_seq_lens_cpu=lens.tolist(),
        )

    # ----------------------------------------------------------------- steps

    def forward_decode(self, fb: ForwardBatch) -> torch.Tensor:
        self.step += 1
        if self.graph_runner.can_run(fb):
            out = self.graph_runner.replay(fb)
            self.attn_backend.advance_kv_lens(fb.batch_size)
        else:
            self.attn_backend.init_forward_metadata(fb)
            out = self.model.forward_decode(fb.input_ids, fb)
            self.eplb_recorder.on_step(fb.batch_size)
        if self.eplb.maybe_rebalance(self.step):
            logger.info("experts rebalanced at step %d", self.step)
        return out

    def forward_extend(self, fb: ForwardBatch) -> torch.Tensor:
        self.attn_backend.init_forward_metadata(fb)
        out = self.model.forward_extend(fb.input_ids, fb)
        self.eplb_recorder.on_step(int(fb.extend_seq_lens_cpu and sum(fb.extend_seq_lens_cpu)))
        return out
