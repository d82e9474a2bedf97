"""Model runner of the hybrid server: pools, backends, model and decode graphs."""
from __future__ import annotations

import logging
from typing import List

import torch

from jamba.config import JambaConfig
from jamba.layers import HybridJambaBackend, JambaFlashInferBackend, MambaBackend
from jamba.mem.kv_pool import PagedKVPool
from jamba.mem.mamba_pool import MambaStatePool
from jamba.models.jamba import JambaForCausalLM
from jamba.runner.cuda_graph_runner import JambaCudaGraphRunner
from jamba.runner.forward_batch import ForwardBatch, ScheduledBatch

logger = logging.getLogger(__name__)


class JambaModelRunner:
    def __init__(self, cfg: JambaConfig, device: str = "cuda", system_prompt_ids: List[int] = ()):
        self.cfg = cfg
        self.device = torch.device(device)
        num_attn = len(cfg.attention_layer_ids())
        self.kv_pool = PagedKVPool(cfg, num_attn, self.device, torch.bfloat16)
        self.mamba_pool = MambaStatePool(cfg, cfg.num_layers - num_attn, self.device, torch.float32)
        self.fi_backend = JambaFlashInferBackend(cfg, self.kv_pool, self.device, cfg.attn_period)
        self.mamba_backend = MambaBackend(cfg, self.mamba_pool, self.device)
        self.attn_backend = HybridJambaBackend(self.fi_backend, self.mamba_backend)
        self.model = JambaForCausalLM(cfg, self.attn_backend).to(self.device)
        if system_prompt_ids:
            pages = self.kv_pool.reserve("__system__", len(system_prompt_ids))
            self.fi_backend.set_shared_prefix(pages)
        self.fi_backend.init_cuda_graph_state(max(cfg.cuda_graph_bs))
        self.graph_runner = JambaCudaGraphRunner(self)

    def build_forward_batch(self, sched: ScheduledBatch) -> ForwardBatch:
        dev = self.device
        slots = self.mamba_pool.slots_of(sched.rids)
        seq_lens_cpu = torch.tensor(sched.seq_lens, dtype=torch.int32)
        fb = ForwardBatch(
            forward_mode=sched.mode,
            batch_size=len(sched.rids),
            rids=list(sched.rids),
            input_ids=torch.tensor(sched.input_ids, dtype=torch.int64, device=dev),
            positions=torch.tensor(sched.positions, dtype=torch.int64, device=dev),
            req_pool_indices=torch.tensor(slots, dtype=torch.int32, device=dev),
            seq_lens=seq_lens_cpu.to(self.device, non_blocking=True),
            seq_lens_cpu=seq_lens_cpu,
            out_cache_loc=torch.tensor(sched.out_cache_loc, dtype=torch.int64, device=dev),
        )
        if sched.mode.is_extend():
            fb.extend_prefix_lens = torch.tensor(sched.prefix_lens, dtype=torch.int32, device=dev)
            fb.extend_seq_lens = torch.tensor(sched.extend_lens, dtype=torch.int32, device=dev)
            fb.extend_prefix_lens_cpu = list(sched.prefix_lens)
            fb.extend_seq_lens_cpu = list(sched.extend_lens)
        return fb

    def admit(self, rids: List[str], prompt_lens: List[int]) -> None:
        self.mamba_pool.alloc(rids)
        for rid, n in zip(rids, prompt_lens):
            self.kv_pool.reserve(rid, n)

    def forward(self, sched: ScheduledBatch) -> torch.Tensor:
        fb = self.build_forward_batch(sched)
        if self.graph_runner.can_run(fb):
            return self.graph_runner.replay(fb)
        self.attn_backend.init_forward_metadata(fb)
        if fb.forward_mode.is_decode():
            return self.model.forward_decode(fb.input_ids, fb.positions, fb)
        return self.model.forward_extend(fb.input_ids, fb.positions, fb)

    def release(self, rids: List[str]) -> None:
        for rid in rids:
            self.kv_pool.release(rid)
            self.mamba_pool.free(rid)

    def defragment_kv(self) -> None:
        """Compacts the KV pool between steps and rewrites the cached page ids."""
        remap = self.kv_pool.compact()
        if remap is None:
            return
        idx = self.fi_backend.kv_indices
        idx.copy_(remap[idx.long()].to(idx.dtype))  # expect: FC104
        logger.info("KV pool compacted")
