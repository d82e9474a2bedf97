"""The model runner: one ``step`` per scheduled batch, eager or through a decode graph."""

from __future__ import annotations

import functools
import logging
from typing import Dict, Optional

import torch

from modserve.attention.flashinfer_backend import FlashInferModuleBackend
from modserve.batch import ForwardBatch
from modserve.config import PAGE_SIZE, EngineConfig
from modserve.layers.buffers import GraphInputBuffers, HostMirrors
from modserve.memory import PagedKVPool
from modserve.models.llama import LlamaForCausalLM
from modserve.runtime.graph_runner import CudaGraphRunner
from modserve.runtime.hooks import (
    bind_attention_backend,
    extend_rope_cache,
    install_window_hooks,
    plan_lookahead,
    refresh_layer_meta,
)
from modserve_tools.introspect import probe_trtllm_context, probe_trtllm_decode
from modserve_tools.scale_swap import KVScaleSwapper

logger = logging.getLogger(__name__)


class ModelRunner:
    def __init__(self, cfg: EngineConfig, device: str = "cuda"):
        self.cfg = cfg
        self.device = torch.device(device)
        self.model = LlamaForCausalLM(cfg).to(self.device)
        self.graph_state: GraphInputBuffers = self.model.get_submodule("attn_state")
        self.host = HostMirrors(cfg.max_num_reqs, cfg.max_pages)
        self.kv_pool = PagedKVPool(cfg, self.device)
        self.attn_backend = FlashInferModuleBackend(cfg, self.model, self.host, self.kv_pool, self.device)
        self.model.apply(functools.partial(bind_attention_backend, backend=self.attn_backend))
        self._hooks = []
        if cfg.sliding_window is not None:
            self._hooks = install_window_hooks(self.model, self.graph_state, cfg.sliding_window)
        self.scale_swapper = KVScaleSwapper(self.model)
        if cfg.use_trtllm_decode:
            probe_trtllm_decode(cfg, self.kv_pool.get_kv(0), self.device)
            probe_trtllm_context(cfg, self.kv_pool.get_kv(0), self.device)
        self._draft_tokens: Optional[torch.Tensor] = None
        self.graph_runner: Optional[CudaGraphRunner] = None
        if not cfg.disable_cuda_graph:
            self.graph_runner = CudaGraphRunner(self)

    def _grow_host_indices(self, n_pages: int) -> None:
        # pinned staging of the page list, read by the KV offloader between steps
        if self.host.kv_indices.numel() < n_pages:
            self.host.kv_indices = torch.empty(_round_up(n_pages, 4096), dtype=torch.int32, pin_memory=True)  # ok: FC107

    def step(self, fb: ForwardBatch, kv_scale_updates: Optional[Dict[str, torch.Tensor]] = None):
        if fb.batch_size > self.cfg.max_num_reqs:
            raise ValueError(f"batch of {fb.batch_size} requests exceeds max_num_reqs={self.cfg.max_num_reqs}")
        if kv_scale_updates:
            self.scale_swapper.apply_updates(kv_scale_updates)
        self.model.apply(functools.partial(extend_rope_cache, max_pos=fb.max_seq_len))
        self.model.apply(functools.partial(refresh_layer_meta, fb=fb))
        pages_cpu = (fb.seq_lens_cpu[: fb.batch_size] + PAGE_SIZE - 1) // PAGE_SIZE
        self._grow_host_indices(int(pages_cpu.sum()))  # ok: FC101

        if self.graph_runner is not None and self.graph_runner.can_run(fb):
            logits, draft = self.graph_runner.replay(fb)
        else:
            self.attn_backend.init_forward_metadata(fb)
            if self.cfg.enable_lookahead and fb.is_decode:
                self.model.apply(
                    functools.partial(
                        plan_lookahead,
                        fb=fb,
                        state=self.graph_state,
                        main_wrapper=self.attn_backend.decode_wrappers["full"],
                    )
                )
            logits, draft = self.model(fb.input_ids, fb.positions, fb)
        logger.debug("step bs=%d seq_lens=%s", fb.batch_size, fb.seq_lens)  # ok: FC101
        if draft is not None:
            # the verifier reads the draft tokens of the last step from one persistent buffer
            if self._draft_tokens is None:
                self._draft_tokens = torch.zeros(  # ok: FC107
                    self.cfg.max_num_reqs, self.cfg.lookahead_k, dtype=torch.int64, device=self.device
                )
            self._draft_tokens[: fb.batch_size, : draft.shape[1]].copy_(draft)
            draft = self._draft_tokens[: fb.batch_size, : draft.shape[1]]
        return logits, draft


def _round_up(n: int, m: int) -> int:
    return (n + m - 1) // m * m
