"""The MoE engine step: prefill or decode, load export every N steps, placement updates between steps."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

import numpy as np
import torch

from moemon import PAGE_SIZE, ExpertLoadRecorder, ExpertPlacement, LoadMonitor, MoEConfig
from mm_attn.attn_backend import AttnBackend
from mm_model.graphs import DecodeGraphs
from mm_model.model import MoEModel


@dataclass
class StepInput:
    is_prefill: bool
    input_ids: torch.Tensor
    seq_lens_np: np.ndarray
    page_ids: torch.Tensor
    block_tables: Optional[torch.Tensor] = None
    seq_lens: Optional[torch.Tensor] = None
    last_idx: Optional[torch.Tensor] = None
    qo_indptr_cpu: Optional[torch.Tensor] = None
    kv_indptr_cpu: Optional[torch.Tensor] = None
    last_page_len_cpu: Optional[torch.Tensor] = None

    @property
    def size(self) -> int:
        return len(self.seq_lens_np)


class MoEEngine:
    def __init__(self, cfg: MoEConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.monitor = LoadMonitor(cfg.num_layers, cfg.num_experts, cfg.ep_size)
        self.recorder = ExpertLoadRecorder(cfg.num_layers, cfg.num_experts, cfg.export_every, device, self.monitor)
        self.placement = ExpertPlacement(cfg.num_layers, cfg.num_experts, device)
        self.attn = AttnBackend(cfg, device)
        self.model = MoEModel(cfg, self.attn, self.recorder, self.placement).to(device)
        kv_shape = (cfg.num_pages, 2, cfg.num_kv_heads, PAGE_SIZE, cfg.head_dim)
        self.kv_caches = [torch.zeros(kv_shape, dtype=torch.bfloat16, device=device) for _ in range(cfg.num_layers)]
        self.mtp_cache = torch.zeros(kv_shape, dtype=torch.bfloat16, device=device)
        self.graphs = DecodeGraphs(self.model, self.attn, self.kv_caches, self.mtp_cache, cfg.decode_buckets, device)
        self.tokens_pinned = torch.empty(cfg.max_prefill_tokens, dtype=torch.int64, pin_memory=True)
        self.done = torch.cuda.Event()
        self.monitor.start()
        self.graphs.capture_all()

    def step(self, inp: StepInput) -> int:
        if inp.is_prefill:
            self.attn.plan_prefill(inp.qo_indptr_cpu, inp.kv_indptr_cpu, inp.page_ids, inp.last_page_len_cpu)
            logits = self.model.prefill(inp.input_ids, inp.last_idx, self.kv_caches)
        elif inp.size <= self.graphs.max_bs:
            logits, _mtp = self.graphs.replay(inp.input_ids, inp.seq_lens_np, inp.page_ids)
        else:
            self.attn.prepare_overflow(inp.seq_lens_np, inp.block_tables, inp.seq_lens, inp.page_ids)
            logits, _mtp = self.model.decode(inp.input_ids, self.kv_caches, self.mtp_cache, None)
        self.recorder.end_step()
        proposal = self.monitor.poll_proposal()
        if proposal is not None:
            self.placement.apply(proposal, self.model.expert_weights())
        n = logits.shape[0]
        self.tokens_pinned[:n].copy_(logits.argmax(dim=-1), non_blocking=True)
        self.done.record()
        return n

    def shutdown(self) -> None:
        self.monitor.stop()

    def expert_map(self) -> List[List[int]]:
        return self.placement.map_np.tolist()
