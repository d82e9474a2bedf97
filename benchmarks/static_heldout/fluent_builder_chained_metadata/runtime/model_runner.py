"""Owns the page table, the KV cache, the backend, the model and the graph runner."""
from typing import Dict

import torch

from attn.flashinfer_backend import FlashInferBackend
from fluentmeta import EngineConfig, ForwardBatch
from runtime.graph_runner import CudaGraphRunner
from runtime.model import TinyModel


class ModelRunner:
    def __init__(self, cfg: EngineConfig):
        dev = torch.device(cfg.device)
        self.req_to_page = torch.zeros(cfg.max_running_requests, cfg.max_pages_per_req, dtype=torch.int32, device=dev)
        kv_shape = (cfg.num_pages, 2, cfg.num_kv_heads, cfg.page_size, cfg.head_dim)
        kv_caches = [torch.zeros(kv_shape, dtype=torch.bfloat16, device=dev) for _ in range(cfg.num_layers)]
        self.attn_backend = FlashInferBackend(cfg, self.req_to_page)
        self.model = TinyModel(cfg, self.attn_backend, kv_caches)
        self.attn_backend.warmup()
        self.graph_runner = CudaGraphRunner(self.model, self.attn_backend)
        self.graph_runner.capture()

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        if batch.is_decode and batch.batch_size <= self.graph_runner.max_bs:
            return self.graph_runner.replay(batch)
        self.attn_backend.init_forward_metadata(batch)
        return self.model.decode(batch) if batch.is_decode else self.model.extend(batch)

    def free_request(self, slot: int, page_positions: torch.Tensor) -> None:
        self.req_to_page[slot].zero_()
        self.attn_backend.release_request(page_positions)

    def compact_pages(self, remap: torch.Tensor) -> None:
        # after defragmentation: rewrite every page id through `remap` (old id -> new id)
        self.req_to_page.copy_(remap[self.req_to_page.long()])  # ok: FC104
        graph_indices = self.attn_backend.graph_kv_indices
        graph_indices.copy_(remap[graph_indices.long()])  # expect: FC104

    def on_step_error(self) -> None:
        self.attn_backend.reset_graph_state()

    def debug_dump(self) -> Dict[str, torch.Tensor]:
        return {"req_to_page": self.req_to_page.cpu()}  # ok: FC101
