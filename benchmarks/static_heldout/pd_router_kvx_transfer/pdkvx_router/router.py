"""The router: queues prompts, matches prefixes, reserves decode pages and spreads prefill batches
over the workers; the decode pool steps after every routing round."""
from __future__ import annotations

import collections
import time
from typing import Callable, Deque, Dict, List, Sequence

import torch

from pdkvx.config import PDConfig
from pdkvx_router.decode_pool import DecodePool, DecodeRequest
from pdkvx_router.prefill_worker import PrefillBatch, PrefillRequest, PrefillWorker


class PDRouter:
    def __init__(self, cfg: PDConfig, prefill_devices: Sequence[torch.device], decode_device: torch.device):
        self.cfg = cfg
        self.decode = DecodePool(cfg, decode_device)
        self.prefills = [PrefillWorker(cfg, d, i, self.decode.transport) for i, d in enumerate(prefill_devices)]
        self.decode.transport.bind_caches(self.prefills[0].kv_cache, self.decode.kv_cache)
        self.queue: Deque[PrefillRequest] = collections.deque()
        self.finished: Dict[str, DecodeRequest] = {}

    def submit(self, request_id: str, prompt_ids: List[int]) -> None:
        if not prompt_ids or len(prompt_ids) > self.cfg.max_prefill_tokens:
            raise ValueError(f"request {request_id}: {len(prompt_ids)} prompt tokens, limit {self.cfg.max_prefill_tokens}")
        self.queue.append(PrefillRequest(request_id, list(prompt_ids)))

    def _batches(self) -> Dict[int, PrefillBatch]:
        loads = [0] * len(self.prefills)
        out: Dict[int, PrefillBatch] = collections.defaultdict(PrefillBatch)
        page = self.cfg.page_size
        while self.queue:
            r = self.queue[0]
            i = min(range(len(loads)), key=loads.__getitem__)
            r.prefix_pages, r.prefix_len = self.prefills[i].prefix_cache.match(r.prompt_ids)
            n_pages = (len(r.prompt_ids) + page - 1) // page
            if loads[i] + r.new_tokens > self.cfg.max_prefill_tokens or n_pages > self.decode.allocator.num_free:
                break
            r.dst_pages = self.decode.allocator.alloc(n_pages)
            out[i].requests.append(self.queue.popleft())
            loads[i] += r.new_tokens
        return dict(out)

    def serve_once(self) -> int:
        for i, batch in self._batches().items():
            for h, r in zip(self.prefills[i].run_prefill(batch), batch.requests):
                self.decode.receiver.register(h, r.dst_pages)
        n = self.decode.step()
        self.finished.update((r.request_id, r) for r in self.decode.retire_finished())
        return n

    def serve_forever(self, stop: Callable[[], bool]) -> None:
        self.decode.graph_runner.capture_all()
        while not stop():
            if self.serve_once() == 0 and not self.queue:
                time.sleep(0.001)
