from __future__ import annotations

import logging

import numpy as np
import torch

from duoserve.config import DuoConfig
from duoserve.kvcache.dual_pool import DualKVPool, roll_window_pages
from duoserve.kvcache.head_pattern import HeadSharder, load_head_pattern
from duoserve.layers.duo_backend import DuoFlashInferBackend
from duoserve.layers.model import DuoLlamaForCausalLM
from duoserve.runner.cuda_graph_runner import CudaGraphRunner
from duoserve.runner.forward_batch import ForwardBatch

logger = logging.getLogger(__name__)


class ModelRunner:
    def __init__(self, cfg: DuoConfig, tp_rank: int = 0):
        self.cfg = cfg
        self.device = torch.device(cfg.device)
        pattern = load_head_pattern(cfg.head_pattern_path, cfg.num_layers, cfg.num_kv_heads, cfg.sparsity)
        self.head_pattern = HeadSharder(pattern, cfg.num_kv_heads, cfg.tp_size, tp_rank).local_pattern()
        self.kv_pool = DualKVPool(cfg, self.head_pattern, self.device)
        self.attn_backend = DuoFlashInferBackend(self)
        self.model = DuoLlamaForCausalLM(cfg, self.attn_backend, self.head_pattern).to(self.device, torch.bfloat16)
        self.graph_runner = CudaGraphRunner(self)
        self.warmup()
        if not cfg.disable_cuda_graph:
            self.graph_runner.capture()

    def warmup(self) -> None:
        # first plan() of each wrapper JIT-compiles its kernels; do it before serving
        if not hasattr(self.attn_backend.full_decode, "_cached_module"):  # expect: FC103
            logger.info("compiling FlashInfer decode kernels for %d retrieval heads", self.head_pattern.num_retrieval)

    def forward(self, fb: ForwardBatch) -> torch.Tensor:
        if fb.forward_mode.is_decode() and self.graph_runner.can_run(fb):
            return self.graph_runner.replay(fb)
        self.attn_backend.init_forward_metadata(fb)
        if fb.forward_mode.is_decode():
            return self.model.forward_decode(fb.input_ids, fb.positions, fb)
        return self.model.forward_extend(fb.input_ids, fb.positions, fb)

    def after_decode_step(self, fb: ForwardBatch) -> None:
        """Rows whose ring wrapped this step get their window list rotated so that the
        next graph replay walks the recent pages oldest first."""
        pool = self.kv_pool
        seq_np = fb.seq_lens_cpu.numpy()
        wrapped = np.flatnonzero((seq_np > pool.window_tokens)
                                 & ((seq_np - pool.sink_tokens) % pool.page_size == 1))
        if wrapped.size and fb.batch_size <= self.graph_runner.max_bs:
            backend = self.attn_backend
            roll_window_pages(backend.stream_kv_indices, backend.stream_kv_indptr_np, wrapped, pool.sink_pages)  # expect: FC104

    def finish(self, slots: list[int]) -> None:
        for s in slots:
            self.kv_pool.free(s)
        if not self.kv_pool.free_slots or len(self.kv_pool.free_slots) == self.kv_pool.max_reqs:
            self.attn_backend.reset_graph_inputs()
