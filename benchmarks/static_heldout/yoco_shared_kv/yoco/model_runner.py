from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Dict, List, Optional

import numpy as np
import torch

from yoco.attention import YocoAttnBackend
from yoco.config import ServerArgs, YocoConfig
from yoco.cuda_graph_runner import CudaGraphRunner
from yoco.forward_batch import ForwardBatch, ForwardMode
from yoco.mem.pools import GlobalKVPool, WindowKVPool
from yoco.models.yoco_decoder import YocoForCausalLM

logger = logging.getLogger(__name__)


@dataclass
class ScheduledReq:
    slot: int
    token_ids: List[int]      # tokens to run this step
    seq_len: int              # length after this step
    window_locs: List[int]
    global_locs: List[int]


class ModelRunner:
    def __init__(self, cfg: YocoConfig, server_args: ServerArgs, num_window_pages: int, num_global_pages: int):
        self.cfg = cfg
        self.server_args = server_args
        self.device = torch.device("cuda")
        max_reqs = server_args.max_running_requests
        self.window_pool = WindowKVPool(
            cfg.num_self_layers, num_window_pages, max_reqs, cfg.wide_window, server_args.page_size,
            cfg.num_kv_heads, cfg.head_dim, self.device,
        )
        self.global_pool = GlobalKVPool(
            num_global_pages, max_reqs, -(-server_args.max_context_len // server_args.page_size),
            server_args.page_size, cfg.num_kv_heads, cfg.head_dim, self.device,
        )
        self.attn_backend = YocoAttnBackend(cfg, server_args, self.window_pool, self.global_pool, self.device)
        self.model = YocoForCausalLM(
            cfg, self.attn_backend.window, self.attn_backend.cross, self.window_pool, self.global_pool
        ).to(self.device)
        self.graph_runner: Optional[CudaGraphRunner] = None
        if not server_args.disable_cuda_graph:
            self.graph_runner = CudaGraphRunner(self)
        self.slot_row: Dict[int, int] = {}

    def init_cuda_graphs(self) -> None:
        if self.graph_runner is not None:
            self.graph_runner.capture()

    def profile_run(self, num_tokens: int) -> int:
        """Start-up: run one dummy prefill and report the peak memory it took."""
        torch.cuda.reset_peak_memory_stats()
        reqs = [ScheduledReq(slot=0, token_ids=[0] * num_tokens, seq_len=num_tokens,
                             window_locs=list(range(num_tokens)), global_locs=list(range(num_tokens)))]
        logits = self.forward(self.prepare_batch(reqs, ForwardMode.EXTEND))
        if not torch.isfinite(logits).all().item():  # ok: FC101
            raise RuntimeError("dummy prefill produced non-finite logits; check the checkpoint")
        return torch.cuda.max_memory_allocated()

    def prepare_batch(self, reqs: List[ScheduledReq], mode: ForwardMode) -> ForwardBatch:
        dev = self.device
        ids, pos, wloc, gloc = [], [], [], []
        ext_lens = []
        for row, r in enumerate(reqs):
            n = len(r.token_ids)
            ids.extend(r.token_ids)
            pos.extend(range(r.seq_len - n, r.seq_len))
            wloc.extend(r.window_locs)
            gloc.extend(r.global_locs)
            ext_lens.append(n)
            self.window_pool.advance(r.slot, r.seq_len)
            self.global_pool.grow(r.slot, r.seq_len)
            self.slot_row[r.slot] = row
        seq_lens_cpu = torch.tensor([r.seq_len for r in reqs], dtype=torch.int32)
        ext_cpu = torch.tensor(ext_lens, dtype=torch.int32)
        starts_cpu = torch.zeros_like(ext_cpu)
        starts_cpu[1:] = torch.cumsum(ext_cpu, 0)[:-1]
        slots_np = np.asarray([r.slot for r in reqs], dtype=np.int32)
        return ForwardBatch(
            forward_mode=mode,
            batch_size=len(reqs),
            input_ids=torch.tensor(ids, dtype=torch.int64).to(dev, non_blocking=True),
            positions=torch.tensor(pos, dtype=torch.int64).to(dev, non_blocking=True),
            out_cache_loc=torch.tensor(wloc, dtype=torch.int64).to(dev, non_blocking=True),
            global_cache_loc=torch.tensor(gloc, dtype=torch.int64).to(dev, non_blocking=True),
            req_slots=torch.from_numpy(slots_np).to(dev, non_blocking=True),
            req_slots_np=slots_np,
            seq_lens=seq_lens_cpu.to(dev, non_blocking=True),
            seq_lens_cpu=seq_lens_cpu,
            extend_seq_lens=ext_cpu.to(dev, non_blocking=True),
            extend_seq_lens_cpu=ext_cpu,
            extend_start_loc_cpu=starts_cpu,
        )

    def forward(self, fb: ForwardBatch) -> torch.Tensor:
        if self.graph_runner is not None and self.graph_runner.can_run(fb):
            logits = self.graph_runner.replay(fb)
        else:
            self.attn_backend.init_forward_metadata(fb)
            logits = self.model(fb.input_ids, fb.positions, fb)
        self.attn_backend.window.recycle_pages(self.window_pool.take_recycled(), self.slot_row)
        return logits
