"""One engine step: metadata, forward (eager or graph replay), sampling."""

from dataclasses import dataclass
from typing import List, Optional

import torch

from .backend import FlashInferBackend
from .config import EngineConfig
from .graph_runner import GraphRunner
from .metadata import ForwardBatch
from .model import AGModel, PagedKVPool
from .sampler import Sampler


@dataclass
class Request:
    req_pool_index: int
    input_ids: List[int]
    seq_len: int
    out_slots: List[int]
    temperature: float = 1.0


class ModelRunner:
    def __init__(self, cfg: EngineConfig):
        self.cfg = cfg
        self.device = torch.device(cfg.device)
        self.req_to_page = torch.zeros(
            cfg.max_batch_size, cfg.pages_per_request, dtype=torch.int32, device=self.device
        )
        self.kv_pool = PagedKVPool(cfg, cfg.max_pages)
        self.attn_backend = FlashInferBackend(cfg, self.req_to_page)
        self.model = AGModel(cfg, self.kv_pool).to(self.device)
        self.sampler = Sampler(cfg)
        self.graph_runner = GraphRunner(cfg, self.model, self.attn_backend)
        # set by the defragmenter between steps: old page id -> new page id
        self.pending_remap: Optional[torch.Tensor] = None

    def init_graphs(self) -> None:
        self.attn_backend.init_cuda_graph_state(self.cfg.graph_buckets)
        self.graph_runner.capture_all()

    def prepare_batch(self, reqs: List[Request], is_decode: bool) -> ForwardBatch:
        ids: List[int] = []
        pos: List[int] = []
        slots: List[int] = []
        for r in reqs:
            n = len(r.input_ids)
            ids.extend(r.input_ids)
            pos.extend(range(r.seq_len - n, r.seq_len))
            slots.extend(r.out_slots)
        seq_lens_cpu = torch.tensor([r.seq_len for r in reqs], dtype=torch.int32)
        dev = self.device
        return ForwardBatch(
            batch_size=len(reqs),
            is_decode=is_decode,
            input_ids=torch.tensor(ids, dtype=torch.int64).to(dev, non_blocking=True),
            positions=torch.tensor(pos, dtype=torch.int64).to(dev, non_blocking=True),
            out_cache_loc=torch.tensor(slots, dtype=torch.int64).to(dev, non_blocking=True),
            seq_lens=seq_lens_cpu.to(dev, non_blocking=True),
            seq_lens_cpu=seq_lens_cpu,
            req_pool_indices=torch.tensor([r.req_pool_index for r in reqs], dtype=torch.int64, device=dev),
            extend_lens=None
            if is_decode
            else torch.tensor([len(r.input_ids) for r in reqs], dtype=torch.int32, device=dev),
            temperatures=torch.tensor([r.temperature for r in reqs], dtype=torch.float32, device=dev),
        )

    def execute_step(self, batch: ForwardBatch) -> torch.Tensor:
        if batch.is_decode and self.graph_runner.can_run(batch.batch_size):
            logits = self.graph_runner.replay(batch)
        else:
            self.attn_backend.init_forward_metadata(batch)
            batch.attn = self.attn_backend.forward_metadata
            if batch.is_decode:
                logits = self.model.forward_decode(batch)
            else:
                logits = self.model.forward_extend(batch)
        next_tokens = self.sampler(logits, batch.temperatures)
        if self.pending_remap is not None:
            # pages moved by the defragmenter: patch the live page table in place
            live = self.attn_backend.kv_indices
            live.copy_(self.pending_remap[live.long()])  # expect: FC104
            self.pending_remap = None
        return next_tokens

    def run_batch(self, reqs: List[Request], is_decode: bool) -> List[int]:
        next_tokens = self.execute_step(self.prepare_batch(reqs, is_decode))
        return next_tokens.tolist()  # ok: FC101
