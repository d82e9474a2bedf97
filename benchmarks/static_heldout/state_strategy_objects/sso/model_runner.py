"""vLLM-shaped model runner: picks a strategy and a state object each step and delegates to them."""

from __future__ import annotations

import logging
from typing import Optional

import numpy as np
import torch

from sso.attention.backend import FlashInferBackend
from sso.attention.registry import StrategyRegistry
from sso.attention.strategies import AttentionStrategy, CascadeStrategy, DecodeStrategy, PrefillStrategy
from sso.config import BatchKind, EngineConfig
from sso.engine_states import CapturingState, EagerState, EngineState, ReplayState
from sso.forward_batch import ForwardBatch, pinned_from_numpy
from sso.graph_manager import CUDAGraphManager
from sso.model import TinyDecoder
from sso.sampling import GreedySampler, NullSampler, SamplerStrategy, TemperatureSampler
from sso_kernels.kv_ops import remap_pages_
from sso_kernels.trtllm_decode import TrtllmDecodeStrategy

logger = logging.getLogger(__name__)


class GPUModelRunner:
    def __init__(self, cfg: EngineConfig) -> None:
        self.cfg = cfg
        self.device = torch.device(cfg.device)
        self.backend = FlashInferBackend(cfg, self.device)
        self.registry = StrategyRegistry(self.backend)
        decode: AttentionStrategy = TrtllmDecodeStrategy(self.backend) if cfg.use_trtllm_decode else DecodeStrategy(self.backend)
        self.registry.register(BatchKind.DECODE, decode)
        self.registry.register(BatchKind.DECODE, decode, graph=True)
        self.registry.register(BatchKind.PREFILL, PrefillStrategy(self.backend))
        if cfg.enable_cascade:
            self.registry.register(BatchKind.CASCADE, CascadeStrategy(self.backend))
        self.strategy: AttentionStrategy = self.registry.get(BatchKind.IDLE)
        self.sampler: SamplerStrategy = NullSampler(cfg.eos_token_id)
        self.model = TinyDecoder(cfg, self).to(self.device)
        self.kv_caches = [
            torch.zeros(cfg.max_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim, dtype=torch.bfloat16, device=self.device)
            for _ in range(cfg.num_layers)
        ]
        self.graph_manager = CUDAGraphManager(self)
        self.state: EngineState = EagerState(self)
        self.tokens_host = torch.zeros(cfg.max_num_seqs, dtype=torch.int64, pin_memory=True)
        self.pending_remap: Optional[torch.Tensor] = None

    # ------------------------------------------------------------------ state machine
    def transition_to(self, new_state: EngineState) -> None:
        assert isinstance(new_state, EngineState)  # expect: FC109
        self.state.on_exit()
        self.state = new_state
        self.state.on_enter()

    def start(self) -> None:
        if self.cfg.enforce_eager:
            return
        self.transition_to(CapturingState(self))
        self.transition_to(ReplayState(self))

    def _next_state(self, batch: ForwardBatch) -> EngineState:
        graphable = (
            batch.kind is BatchKind.DECODE
            and not self.cfg.enforce_eager
            and batch.batch_size <= self.graph_manager.max_bs
        )
        if graphable and not isinstance(self.state, ReplayState):
            return ReplayState(self)
        if not graphable and not isinstance(self.state, EagerState):
            return EagerState(self)
        return self.state

    # ------------------------------------------------------------------ inputs
    def prepare_inputs(self, sched: dict) -> ForwardBatch:
        seq_lens_np: np.ndarray = sched["seq_lens"]
        query_lens_np: np.ndarray = sched["query_lens"]
        bs = len(seq_lens_np)
        page = self.cfg.page_size
        qo_indptr_np = np.zeros(bs + 1, dtype=np.int32)
        np.cumsum(query_lens_np, out=qo_indptr_np[1:])
        pages_np = (seq_lens_np + page - 1) // page
        kv_indptr_np = np.zeros(bs + 1, dtype=np.int32)
        np.cumsum(pages_np, out=kv_indptr_np[1:])
        last_np = (seq_lens_np - 1) % page + 1
        qo_indptr_cpu = pinned_from_numpy(qo_indptr_np)
        seq_lens_cpu = pinned_from_numpy(seq_lens_np.astype(np.int32))
        prefix_np = sched.get("prefix_lens")
        prefix_cpu = pinned_from_numpy(prefix_np) if prefix_np is not None else None
        num_prefills = int((query_lens_np > 1).sum())
        batch = ForwardBatch(
            kind=BatchKind.DECODE,
            batch_size=bs,
            num_real_seqs=bs,
            num_prefills=num_prefills,
            num_tokens=int(qo_indptr_np[-1]),
            req_ids=list(sched["req_ids"]),
            input_ids=torch.from_numpy(sched["input_ids"]).to(self.device, non_blocking=True),
            positions=torch.from_numpy(sched["positions"]).to(self.device, non_blocking=True),
            seq_lens=seq_lens_cpu.to(self.device, non_blocking=True),
            qo_indptr=qo_indptr_cpu.to(self.device, non_blocking=True),
            kv_indices=torch.from_numpy(sched["block_ids"]).to(self.device, non_blocking=True),
            seq_lens_cpu=seq_lens_cpu,
            qo_indptr_cpu=qo_indptr_cpu,
            kv_indptr_cpu=pinned_from_numpy(kv_indptr_np),
            kv_last_page_len_cpu=pinned_from_numpy(last_np.astype(np.int32)),
            prefix_lens=prefix_cpu.to(self.device, non_blocking=True) if prefix_cpu is not None else None,
            prefix_lens_cpu=prefix_cpu,
            temperatures=torch.from_numpy(sched["temperatures"]).to(self.device, non_blocking=True),
        )
        batch.kind = self.registry.classify(batch)
        return batch

    # ------------------------------------------------------------------ step
    def execute_model(self, sched: dict) -> list[int]:
        batch = self.prepare_inputs(sched)
        self.strategy = self.registry.get(batch.kind)
        self.sampler = self._pick_sampler(batch)
        nxt = self._next_state(batch)
        if nxt is not self.state:
            self.transition_to(nxt)
        if isinstance(self.state, ReplayState):
            batch.use_graph = True
        hidden = self.state.on_step(batch)
        logits = hidden @ self.model.embed.weight.t()
        next_tokens = self.sampler.sample(logits, batch)
        done = self.sampler.finished(next_tokens, batch)
        if done:
            logger.debug("finished %s", done)
        if self.pending_remap is not None:
            self.compact_kv(self.pending_remap)
        bs = batch.num_real_seqs
        self.tokens_host[:bs].copy_(next_tokens[:bs], non_blocking=True)
        return self.tokens_host[:bs].tolist()  # expect: FC101

    def _pick_sampler(self, batch: ForwardBatch) -> SamplerStrategy:
        if batch.kind is BatchKind.IDLE:
            return NullSampler(self.cfg.eos_token_id)
        if batch.temperatures is None:
            return GreedySampler(self.cfg.eos_token_id)
        return TemperatureSampler(self.cfg.eos_token_id)

    def compact_kv(self, old_to_new: torch.Tensor) -> None:
        """Apply the block manager's defragmentation map to every page table the engine keeps."""
        remap_pages_(self.backend.cuda_graph_kv_indices, old_to_new)  # expect: FC104
        self.pending_remap = None
