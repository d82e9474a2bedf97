"""Model runner: owns the model, the attention backend, the graphs and the sampler."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from attn.flashinfer_backend import FlashInferBackend
from attn.trtllm_path import DraftDecode
from runtime.graph_runner import CudaGraphRunner
from runtime.memory import ReqToTokenPool
from runtime.model import DecodeModel
from runtime.sampler import Sampler
from tmeta.batch import ForwardBatch
from tmeta.config import EngineConfig
from tmeta.metadata import StepMeta


@dataclass
class StepOutput:
    next_ids_cpu: torch.Tensor
    ready: torch.cuda.Event

    def tolist(self) -> list[int]:
        """Block until the sampled ids have landed in host memory (detokenizer thread)."""
        self.ready.synchronize()  # ok: FC101
        return self.next_ids_cpu.tolist()


class ModelRunner:
    def __init__(self, cfg: EngineConfig, device: str | torch.device = "cuda") -> None:
        self.cfg = cfg
        self.device = torch.device(device)
        self.pool = ReqToTokenPool(cfg, self.device)
        self.backend = FlashInferBackend(cfg, self.pool, self.device)
        self.kv_caches = [
            torch.zeros(
                cfg.num_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim,
                dtype=torch.bfloat16, device=self.device,
            )
            for _ in range(cfg.num_layers)
        ]
        self.model = DecodeModel(cfg, self.backend, self.kv_caches).to(self.device, torch.bfloat16)
        self.sampler = Sampler(cfg.vocab_size, cfg.max_batch_size)
        self.draft: Optional[DraftDecode] = (
            DraftDecode(cfg, self.device, use_trtllm=cfg.decode_kernel == "trtllm-gen") if cfg.mtp else None
        )
        self.graph_runner: CudaGraphRunner | None = None
        self.finished_rows_cpu: list[int] = []
        self.next_ids_cpu = torch.empty(cfg.max_batch_size, dtype=torch.int64, pin_memory=True)
        self._ids_ready = torch.cuda.Event()
        self.last_meta: StepMeta | None = None

    def init_cuda_graphs(self) -> None:
        runner = CudaGraphRunner(self)
        runner.capture()
        self.graph_runner = runner

    def execute_step(self, batch: ForwardBatch) -> StepOutput:
        raw_bs = batch.batch_size
        runner = self.graph_runner
        meta: StepMeta
        if runner is not None and runner.can_run(batch):
            decode_meta = runner.replay_prepare(batch)
            if self.draft is not None:
                # the MTP head appends its draft token behind the target token
                decode_meta.kv_last_page_len[:raw_bs].add_(1)  # expect: FC104
            if self.finished_rows_cpu:
                self._park_finished_rows(self.finished_rows_cpu)
            logits = runner.replay_graph()
            meta = decode_meta
        else:
            meta = self.backend.init_forward_metadata(batch)
            logits = self.model(batch.input_ids, batch.positions, batch.kind)
            if batch.last_token_rows is not None:
                logits = logits[batch.last_token_rows]
        self.last_meta = meta
        next_ids = self.sampler(logits, batch.sampling)
        if raw_bs > self.next_ids_cpu.numel():
            self.next_ids_cpu = torch.empty(raw_bs, dtype=torch.int64, pin_memory=True)  # ok: FC107
        self.next_ids_cpu[:raw_bs].copy_(next_ids, non_blocking=True)
        self._ids_ready.record()
        return StepOutput(self.next_ids_cpu[:raw_bs], self._ids_ready)

    def _park_finished_rows(self, rows: list[int]) -> None:
        """Rows whose request finished last step stay in the bucket until the scheduler refills them."""
        meta = self.backend.decode_slot.get()
        for row in rows:
            meta.kv_last_page_len[row] = 1  # expect: FC104
        rows.clear()

    def draft_step(self, q: torch.Tensor, layer_id: int) -> torch.Tensor:
        draft = self.draft
        if draft is None:
            raise RuntimeError("MTP drafting is disabled")
        wrapper = draft.plan_draft(self.backend.decode_slot.get())
        return wrapper.run(q, self.kv_caches[layer_id])
