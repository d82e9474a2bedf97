"""The decode node's loop: admit landed transfers, watch for stalls, decode."""

from __future__ import annotations

from typing import Dict, List, Optional

import numpy as np
import torch

from kvx import CompletionFlags, PageMapper, RegisteredRegion, TransferConfig, Verbs
from kx_decode.backend import DecodeAttnBackend
from kx_decode.graphs import DecodeGraphs
from kx_decode.model import DecodeModel
from kx_decode.receiver import DecodeReceiver, ReadyBatch
from kx_decode.watchdog import TransferWatchdog


class DecodeEngine:
    def __init__(self, cfg: TransferConfig, verbs: Verbs, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.region = RegisteredRegion(cfg.num_slots * cfg.max_pages_per_transfer * cfg.page_bytes, verbs)
        self.flags = CompletionFlags(cfg.num_slots, device)
        self.mapper = PageMapper(cfg, device)
        self.backend = DecodeAttnBackend(cfg, self.mapper, device)
        # page-major so that one page of every layer is contiguous for the transfer
        kv_shape = (cfg.max_pages, cfg.num_layers, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim)
        self.kv_cache = torch.zeros(kv_shape, dtype=torch.bfloat16, device=device)
        self.model = DecodeModel(cfg, self.backend).to(device)
        pages_view = self.kv_cache.view(cfg.max_pages, -1)
        self.receiver = DecodeReceiver(cfg, self.flags, self.region, self.mapper, self.backend, pages_view, device)
        self.watchdog = TransferWatchdog(cfg, self.receiver, self.backend)
        self.graphs = DecodeGraphs(cfg, self.model, self.backend, self.kv_cache, device)
        self.running: List[int] = []
        self.seq_lens_np = np.zeros(cfg.max_batch, dtype=np.int64)
        self.last_tokens = torch.zeros(cfg.max_batch, dtype=torch.int64, device=device)
        self._plan_info: Dict[str, int] = {}

    def start(self) -> None:
        self.graphs.record_all()

    def admit(self, ready: ReadyBatch) -> None:
        base = len(self.running)
        for i, m in enumerate(ready.manifests):
            self.running.append(m.rid)
            self.seq_lens_np[base + i] = m.seq_len
        self.last_tokens[base : base + len(ready.manifests)].copy_(ready.first_tokens)

    def abort(self, slot: int) -> None:
        m = self.receiver.manifests.pop(slot, None)
        self.flags.arm(slot, 0)
        self.receiver.inflight_since.pop(slot, None)
        if m is not None and m.rid in self.mapper.req_pages:
            self.mapper.release(m.rid)

    def finish_tails(self, tail_ids: torch.Tensor, tail_positions: torch.Tensor, tail_lens_np: np.ndarray) -> torch.Tensor:
        """Prompt tokens the prefill node did not run (its last chunk) are computed here."""
        self.mapper.rebuild(self.running)
        self.backend.plan_tail(tail_lens_np, len(self.running))
        return self.model.forward_tail(tail_ids, tail_positions, self.kv_cache)

    def grow_pool(self, new_max_pages: int) -> None:
        self.backend.rebind_indices(torch.zeros(new_max_pages, dtype=torch.int32, device=self.device))

    def step(self) -> Optional[torch.Tensor]:
        ready = self.receiver.poll()
        if ready is not None:
            self.admit(ready)
        for slot in self.watchdog.check():
            self.abort(slot)
        n = len(self.running)
        if n == 0:
            return None
        self.mapper.rebuild(self.running)
        self.receiver.append_cursor = int(self.mapper.table.kv_indptr_host[n])
        ids = self.last_tokens[:n]
        positions = torch.from_numpy(self.seq_lens_np[:n]).to(self.device, non_blocking=True)
        if n <= self.cfg.buckets[-1]:
            logits = self.graphs.run_bucket(n, ids, positions)
        else:
            self.backend.plan_eager(n)
            logits = self.model.forward_decode(ids, positions, self.kv_cache, self.cfg.max_context)
        self.last_tokens[:n].copy_(logits.argmax(dim=-1))
        self.seq_lens_np[:n] += 1
        self._plan_info = {"rows": n, "bucket": self.backend.bucket or 0}  # ok: FC103
        return logits
