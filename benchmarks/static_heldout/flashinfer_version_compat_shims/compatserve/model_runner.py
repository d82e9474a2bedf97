"""Owns the model, the KV pool, the attention backend, the graphs and the sampler."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Optional

import torch

from compatserve import compat
from compatserve.attention.flashinfer_backend import FlashInferAttnBackend
from compatserve.config import EngineConfig
from compatserve.forward_batch import ForwardBatch
from compatserve.graph_runner import CudaGraphRunner
from compatserve.model import CompatLM, KVPool
from compatserve.sampler import Sampler

logger = logging.getLogger(__name__)


@dataclass
class StepOutput:
    next_token_ids: torch.Tensor  # device
    next_token_ids_host: torch.Tensor  # pinned; valid once `ready` has completed
    ready: torch.cuda.Event


class ModelRunner:
    def __init__(self, cfg: EngineConfig):
        compat.require_version("0.1.6")
        if cfg.decode_backend == "trtllm" and not compat.HAS_TRTLLM_GEN:
            logger.warning("flashinfer %s has no trtllm-gen backend; decoding with fa2", compat.FLASHINFER_VERSION)
        if cfg.decode_backend == "trtllm-raw" and cfg.disable_cuda_graph:
            raise ValueError("decode_backend='trtllm-raw' keeps its block tables in the CUDA-graph state")
        self.cfg = cfg
        self.device = torch.device(cfg.device)
        self.req_to_page = torch.zeros(
            (cfg.max_running_requests, cfg.max_pages_per_req), dtype=torch.int32, device=self.device
        )
        self.kv_pool = KVPool(cfg, self.device)
        self.attn_backend = FlashInferAttnBackend(cfg, self.kv_pool, self.req_to_page)
        self.model = CompatLM(cfg, self.attn_backend).to(device=self.device, dtype=cfg.dtype)
        self.sampler = Sampler(cfg.vocab_size)
        self.graph_runner: Optional[CudaGraphRunner] = None
        if not cfg.disable_cuda_graph:
            self.graph_runner = CudaGraphRunner(self, cfg.cuda_graph_bs)
        self._next_ids_host: Optional[torch.Tensor] = None
        self._copy_event = torch.cuda.Event()

    @torch.inference_mode()
    def execute_step(self, fb: ForwardBatch) -> StepOutput:
        if self.graph_runner is not None and self.graph_runner.can_run(fb):
            logits = self.graph_runner.replay(fb)
        else:
            self.attn_backend.init_forward_metadata(fb)
            logits = self.model(fb.input_ids, fb.positions, fb)
        next_ids = self.sampler(logits, fb.sampling)

        if self._next_ids_host is None:
            self._next_ids_host = torch.empty(self.cfg.max_batch_size, dtype=torch.int64, pin_memory=True)  # ok: FC107
        host = self._next_ids_host[: fb.batch_size]
        host.copy_(next_ids, non_blocking=True)  # ok: FC101
        self._copy_event.record()
        return StepOutput(next_ids, host, self._copy_event)
