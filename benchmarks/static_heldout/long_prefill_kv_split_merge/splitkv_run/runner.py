"""Prefill of one long prompt: split on the host, stage its page table on the device, plan
every chunk wrapper, run the model once; the chunk outputs are merged inside each layer."""

import torch

from splitkv import ChunkPlanner, LongPrompt, SplitConfig
from splitkv_attn.backend import SplitAttnBackend
from splitkv_run.model import SplitModel


class ChunkedPrefillRunner:
    def __init__(self, cfg: SplitConfig, backend: SplitAttnBackend, planner: ChunkPlanner, model: SplitModel, kv_cache):
        self.cfg = cfg
        self.backend = backend
        self.planner = planner
        self.model = model
        self.kv_cache = kv_cache
        scratch_pages = cfg.max_chunks * cfg.chunk_kv_pages
        self.chunk_indices_scratch = torch.zeros(scratch_pages, dtype=torch.int32, device=backend.device)
        self.lse_host = torch.zeros(cfg.chunk_q_tokens, cfg.num_qo_heads, dtype=torch.float32, pin_memory=True)
        self.last_event = torch.cuda.Event()

    def run_chunks(self, req: LongPrompt) -> torch.Tensor:
        plan = self.planner.split(req.page_table, req.prefix_len, req.q_len, self.cfg.chunk_kv_pages)
        longest = int(plan.kv_lens_np.max()) if plan.num_chunks else 0  # ok: FC101
        if longest > self.cfg.chunk_kv_tokens:
            raise ValueError(f"chunk of {longest} tokens exceeds chunk_kv_tokens={self.cfg.chunk_kv_tokens}")
        n = plan.page_table.shape[0]
        pages = torch.from_numpy(plan.page_table)
        if n <= self.chunk_indices_scratch.numel():
            self.chunk_indices_scratch[:n].copy_(pages, non_blocking=True)  # ok: FC104
            staged = self.chunk_indices_scratch[:n]
        else:
            # decode is idle while a long prompt prefills: borrow its larger indices buffer
            self.backend.dec_indices[:n].copy_(pages, non_blocking=True)  # expect: FC104
            staged = self.backend.dec_indices[:n]
        self.backend.plan_chunks(plan, staged)
        logits = self.model.prefill(req.tokens_dev, req.positions_dev, self.kv_cache)
        q_len = req.q_len
        self.lse_host[:q_len].copy_(self.backend.lse_scratch[:q_len], non_blocking=True)  # ok: FC101
        self.last_event.record()
        return logits

    def lse_summary(self) -> dict:
        self.last_event.synchronize()
        return {"lse_max": float(self.lse_host.max())}
