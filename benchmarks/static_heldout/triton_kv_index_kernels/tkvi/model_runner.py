"""Owns the model, the KV pools, the attention backend and the decode graphs; one call per scheduler step."""

from __future__ import annotations

import logging
from typing import List, Optional

import numpy as np
import torch

from tkvi.attention.flashinfer_backend import FlashInferAttnBackend
from tkvi.config import ServerArgs, global_config
from tkvi.cuda_graph_runner import CudaGraphRunner
from tkvi.forward_batch import ForwardBatch, ScheduleBatch
from tkvi.memory_pool import KVDefragmenter, ReqToTokenPool, TokenToKVPool
from tkvi.model import LlamaForCausalLM

logger = logging.getLogger(__name__)


class ModelRunner:
    def __init__(self, server_args: ServerArgs, gpu_id: int = 0):
        self.server_args = server_args
        self.device = torch.device("cuda", gpu_id)
        self.dtype = torch.bfloat16
        self.kv_cache_dtype = torch.bfloat16
        torch.cuda.set_device(self.device)

        self.req_to_token_pool = ReqToTokenPool(
            server_args.max_running_requests + 1, server_args.max_context_len, self.device
        )
        self.token_to_kv_pool = TokenToKVPool(
            server_args.max_total_tokens,
            server_args.num_kv_heads,
            server_args.head_dim,
            server_args.num_layers,
            self.kv_cache_dtype,
            self.device,
        )
        self.model = LlamaForCausalLM(server_args).to(device=self.device, dtype=self.dtype)
        self.init_attention_backend()
        self.defragmenter = KVDefragmenter(self.token_to_kv_pool, self.req_to_token_pool, global_config.kv_index_block_size)

        max_bs = server_args.max_running_requests
        self.next_token_ids_cpu = torch.zeros((max_bs,), dtype=torch.int64, pin_memory=True)
        self.sample_done = torch.cuda.Event()
        self.cuda_graph_runner: Optional[CudaGraphRunner] = None
        if not server_args.disable_cuda_graph:
            self.init_cuda_graphs()

    def init_attention_backend(self) -> None:
        self.attn_backend = FlashInferAttnBackend(self)

    def init_cuda_graphs(self) -> None:
        self._warmup_prefill_kernels()
        self.cuda_graph_runner = CudaGraphRunner(self)

    def _warmup_prefill_kernels(self) -> None:
        """JIT-compile the ragged prefill kernel once, before any graph is recorded."""
        args = self.server_args
        n = 16
        qo_indptr = torch.tensor([0, n], dtype=torch.int32)
        wrapper = self.attn_backend.prefill_wrapper_ragged
        wrapper.begin_forward(qo_indptr, qo_indptr, args.num_attention_heads, args.num_kv_heads, args.head_dim, q_data_type=self.dtype)  # ok: FC102
        q = torch.randn((n, args.num_attention_heads, args.head_dim), dtype=self.dtype, device=self.device)
        k = torch.randn((n, args.num_kv_heads, args.head_dim), dtype=self.dtype, device=self.device)
        v = torch.randn_like(k)
        wrapper.forward(q, k, v, causal=True)  # ok: FC108
        torch.cuda.synchronize()

    # ------------------------------------------------------------------ per step

    def forward_batch_generation(self, batch: ScheduleBatch) -> torch.Tensor:
        forward_batch = ForwardBatch.init_new(batch, self)
        forward_batch.attn_backend = self.attn_backend
        if self.cuda_graph_runner is not None and self.cuda_graph_runner.can_run(forward_batch):
            logits = self.cuda_graph_runner.replay(forward_batch)
        else:
            logits = self.forward(forward_batch)
        return self.sample(logits, forward_batch)

    def forward(self, forward_batch: ForwardBatch) -> torch.Tensor:
        self.attn_backend.init_forward_metadata(forward_batch)
        if forward_batch.forward_mode.is_decode():
            return self.model.forward_decode(forward_batch.input_ids, forward_batch.positions, forward_batch)
        return self.model.forward_extend(forward_batch.input_ids, forward_batch.positions, forward_batch)

    def sample(self, logits: torch.Tensor, forward_batch: ForwardBatch) -> torch.Tensor:
        next_token_ids = torch.argmax(logits, dim=-1)
        bs = forward_batch.batch_size
        # the scheduler reads the ids after the event, while the next step is already queued
        self.next_token_ids_cpu[:bs].copy_(next_token_ids, non_blocking=True)  # ok: FC101
        self.sample_done.record()
        return next_token_ids

    # ------------------------------------------------------------------ between steps

    def read_next_token_ids(self, bs: int) -> List[int]:
        """Called from the scheduler's output processing, after the step was launched."""
        self.sample_done.synchronize()
        return self.next_token_ids_cpu[:bs].tolist()

    def maybe_defragment(self, live_pages: np.ndarray) -> None:
        """When the live pages are scattered past the threshold, move them to the front of the pool."""
        pool = self.token_to_kv_pool
        if live_pages.size == 0 or live_pages.max() < self.server_args.kv_defrag_threshold * pool.size:
            return
        new_ids = np.arange(1, live_pages.size + 1, dtype=np.int64)
        remap_np = np.arange(pool.size + 1, dtype=np.int64)
        remap_np[live_pages] = new_ids
        moved = live_pages != new_ids
        self.defragmenter.compact(
            torch.from_numpy(remap_np).to(self.device),
            torch.from_numpy(live_pages[moved]).to(self.device),
            torch.from_numpy(new_ids[moved]).to(self.device),
        )
        pool.free_pages_np = np.arange(live_pages.size + 1, pool.size + 1, dtype=np.int64)
