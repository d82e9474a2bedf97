import logging

import numpy as np
import torch

from moeoffload.kernels.expert_gemm import expert_slots_for
from moeoffload.lru import ExpertLRU

logger = logging.getLogger(__name__)


class ExpertCache:
    """GPU-resident expert slots in front of the pinned host store."""

    def __init__(self, cfg, store, device):
        self.cfg = cfg
        self.store = store
        self.device = device
        n_slots = cfg.gpu_expert_slots * cfg.num_layers
        self.lru = ExpertLRU(n_slots)
        self.w13_slots = torch.empty((n_slots, 2 * cfg.ffn, cfg.hidden), dtype=torch.bfloat16, device=device)
        self.w2_slots = torch.empty((n_slots, cfg.hidden, cfg.ffn), dtype=torch.bfloat16, device=device)
        self.slot_of_expert = torch.full((cfg.num_layers, cfg.num_experts), -1, dtype=torch.int32, device=device)
        self.slot_of_expert_np = np.full((cfg.num_layers, cfg.num_experts), -1, dtype=np.int32)
        self.staging_ids = torch.empty(cfg.max_batch * cfg.top_k, dtype=torch.int32, device=device)
        self.slot_scratch = torch.empty(cfg.max_batch * cfg.top_k, dtype=torch.int32, device=device)
        self.load_stream = torch.cuda.Stream(device=device)
        self.load_done = torch.cuda.Event()

    def on_router_scores(self, layer, topk_ids):
        """Every MoE layer calls this with its routing decision: make the chosen experts resident."""
        n = topk_ids.numel()
        if n > self.staging_ids.shape[0]:
            # prefill chunks route more tokens than a decode batch
            self.staging_ids = torch.empty(n, dtype=torch.int32, device=self.device)  # expect: FC107
        self.staging_ids[:n].copy_(topk_ids.reshape(-1))
        wanted = torch.unique(self.staging_ids[:n])  # expect: FC101
        keys = [(layer, e) for e in wanted.tolist()]  # expect: FC101
        self.lru.pin(keys)
        missing = [key for key in keys if self.lru.lookup(key) is None]
        self._load(missing)
        self.lru.unpin_all()
        logger.debug("layer %d slot map %s", layer, self.slot_of_expert[layer])  # ok: FC101
        return expert_slots_for(topk_ids, self.slot_of_expert[layer], self.slot_scratch)

    def prefetch(self, layer, experts):
        """Load host-predicted experts of `layer` ahead of time (not pinned, may be evicted again)."""
        keys = [(layer, e) for e in experts if self.slot_of_expert_np[layer, e] < 0]
        self._load(keys)

    def _load(self, keys):
        if not keys:
            return
        self.load_stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.load_stream):
            for layer, e in keys:
                slot, victim = self.lru.admit((layer, e))
                if victim is not None:
                    self.slot_of_expert_np[victim] = -1
                self.w13_slots[slot].copy_(self.store.w13[layer, e], non_blocking=True)
                self.w2_slots[slot].copy_(self.store.w2[layer, e], non_blocking=True)
                self.slot_of_expert_np[layer, e] = slot
            self.slot_of_expert.copy_(torch.from_numpy(self.slot_of_expert_np), non_blocking=True)
            self.load_done.record(self.load_stream)
        torch.cuda.current_stream().wait_event(self.load_done)

    def residency_report(self):
        """Admin endpoint: how many experts are on the GPU right now."""
        resident = (self.slot_of_expert >= 0).sum().item()  # ok: FC101
        return {"resident": resident, "hits": self.lru.hits, "misses": self.lru.misses}
