"""The serving loop: host bookkeeping, MLA planning on every device, then graph replay or eager prefill."""
from __future__ import annotations

import dataclasses
from typing import List

import torch

from ktrans.models.deepseek_v3 import DeepseekV3ForCausalLM
from ktrans.operators.experts import CPUInfer
from ktrans.operators.flashinfer_mla import MLAWrapper, MLAWrapperSingleton
from ktrans.util.cuda_graph_runner import DecodeGraphRunner


@dataclasses.dataclass
class StepBatch:
    token_ids: List[int]
    positions_host: torch.Tensor  # the scheduler's host tensors
    kv_lens_host: torch.Tensor
    q_lens_host: torch.Tensor
    page_ids: torch.Tensor  # device page list, gathered by the page table
    is_decode: bool
    size: int = dataclasses.field(init=False)

    def __post_init__(self):
        self.size = len(self.token_ids)  # decode: one token per request; prefill: one chunk per request


class HybridEngine:
    def __init__(self, cfg):
        self.cfg, self.device = cfg, torch.device(cfg.device)
        self.mla: MLAWrapper = MLAWrapperSingleton.get_instance(self.device, cfg)
        self.model = DeepseekV3ForCausalLM(cfg, CPUInfer(cfg.cpu_threads), self.device).to(self.device)
        # old -> new page id, filled by the KV pool when it compacts live pages to the front
        self.page_remap = torch.arange(cfg.max_pages, dtype=torch.int32, device=self.device)
        self.num_live_pages, self.fragmented, self.runner = 0, False, DecodeGraphRunner(self.model, cfg, self.device)
        self.plan_kw = dict(num_heads=cfg.num_heads, head_dim_ckv=cfg.kv_lora_rank, head_dim_kpe=cfg.qk_rope_head_dim,
                            sm_scale=cfg.sm_scale, q_dtype=torch.bfloat16, kv_dtype=torch.bfloat16)

    def compact_kv_pages(self) -> None:
        n = self.num_live_pages
        self.mla.kv_indices_buf[:n] = self.page_remap[self.mla.kv_indices_buf[:n].long()]  # expect: FC104
        self.fragmented = False

    def warmup(self) -> None:
        self.runner.record(self.mla, self.plan_kw)

    @torch.inference_mode()
    def step(self, batch: StepBatch) -> torch.Tensor:
        input_ids = torch.tensor(batch.token_ids, dtype=torch.long).to(self.device, non_blocking=True)
        position_ids = batch.positions_host.to(self.device, non_blocking=True)
        if batch.is_decode:
            MLAWrapperSingleton.plan_all(batch.size, batch.kv_lens_host, batch.page_ids, **self.plan_kw)
            if self.cfg.use_nextn:
                self.mla.plan_nextn(**self.plan_kw)
            if self.fragmented:
                self.compact_kv_pages()
            return self.runner.replay(batch.size, input_ids, position_ids)
        self.mla.plan_prefill(batch.q_lens_host, batch.kv_lens_host, batch.page_ids, **self.plan_kw)
        return self.model.forward_prefill(input_ids, position_ids)
