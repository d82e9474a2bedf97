"""Decode instance: one graph-mode decode wrapper per batch-size bucket, all bound to shared device
page tables, one recorded CUDA graph per bucket, an eager fallback above the largest bucket."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterator, List

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper, CUDAGraphBatchDecodeWithPagedKVCacheWrapper
from flashinfer.decode import fast_decode_plan, xqa_batch_decode_with_kv_cache

from xllm.core import EngineConfig, WorkspaceMiB
from xllm.core.kv_transfer import KVTransferEngine


@dataclass
class DecodeBatch:
    request_ids: frozenset
    size: int
    kv_lens_host: np.ndarray
    page_indices: torch.Tensor
    input_ids: torch.Tensor


class DecodeGraphPool:
    """Records one CUDA graph per bucket on a side stream."""

    def __init__(self, instance: "DecodeInstance"):
        self.instance = instance
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.capture_stream = torch.cuda.Stream()

    def record(self, bs: int) -> None:
        inst = self.instance
        inst.prepare_decode_inputs(DecodeBatch(frozenset(), bs, np.ones(bs, dtype=np.int32), inst.kv_indices_dev[:bs], inst.input_ids_dev[:bs]))
        self.capture_stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.capture_stream):
            inst.forward_decode(bs)
        self.capture_stream.synchronize()  # ok: FC101
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=self.capture_stream):
            self.outputs[bs] = inst.forward_decode(bs)
        self.graphs[bs] = graph


class DecodeInstance:
    def __init__(self, cfg: EngineConfig, model, kv_cache: List[torch.Tensor], transfer: KVTransferEngine, device: torch.device):
        self.cfg = cfg
        self.model = model
        self.kv_cache = kv_cache
        self.transfer = transfer
        self.device = device
        max_bs = cfg.max_decode_batch
        self.workspace = torch.zeros(WorkspaceMiB.DECODE << 20, dtype=torch.uint8, device=device)  # expect: FC106
        self.init_graph_buffers(max_bs)
        self.wrappers: Dict[int, CUDAGraphBatchDecodeWithPagedKVCacheWrapper] = {
            bs: CUDAGraphBatchDecodeWithPagedKVCacheWrapper(
                self.workspace, self.kv_indptr_dev[: bs + 1], self.kv_indices_dev, self.last_page_len_dev[:bs], "NHD"
            )
            for bs in cfg.decode_buckets
        }
        self.eager_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.workspace, "NHD")
        self.verify_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.workspace, "NHD")
        xqa_bytes = max_bs * cfg.num_qo_heads * cfg.head_dim * 4 * 4
        self.xqa_workspace = torch.empty(xqa_bytes, dtype=torch.uint8, device=device)  # expect: FC105
        self._backend = "xqa" if cfg.use_xqa_decode else "fa2"  # ok: FC103
        self.graph_pool = DecodeGraphPool(self)
        transfer.attach_decode(self)

    def init_graph_buffers(self, max_bs: int) -> None:
        self.kv_indptr_dev = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        self.kv_indices_dev = torch.zeros(self.cfg.max_pages, dtype=torch.int32, device=self.device)
        self.last_page_len_dev = torch.empty(max_bs, dtype=torch.int32, device=self.device)
        self.last_page_len_dev.fill_(1)  # ok: FC104
        self.kv_lens_dev = torch.zeros(max_bs, dtype=torch.int32, device=self.device)
        self.block_tables_dev = torch.zeros(max_bs, self.cfg.max_model_len // self.cfg.page_size, dtype=torch.int32, device=self.device)
        self.input_ids_dev = torch.zeros(max_bs * (1 + self.cfg.num_speculative_tokens), dtype=torch.int64, device=self.device)
        self.kv_indptr_host = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_len_host = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)

    def record_all(self) -> None:
        for bs in sorted(self.cfg.decode_buckets, reverse=True):
            self.graph_pool.record(bs)

    def _bucket(self, n: int) -> int:
        return min(bs for bs, w in self.wrappers.items() if w._fixed_batch_size >= n)  # expect: FC103

    def prepare_decode_inputs(self, batch: DecodeBatch) -> int:
        n, ps = batch.size, self.cfg.page_size
        bs = self._bucket(n)
        pages = (batch.kv_lens_host + ps - 1) // ps
        indptr = self.kv_indptr_host[: bs + 1]
        indptr[1 : n + 1] = torch.from_numpy(np.cumsum(pages, dtype=np.int32))
        indptr[n + 1 :] = indptr[n]
        num_pages = int(self.kv_indptr_host[n])  # ok: FC101
        rem = batch.kv_lens_host % ps
        self.last_page_len_host[:n] = torch.from_numpy(np.where(rem == 0, ps, rem).astype(np.int32))
        if num_pages > self.kv_indices_dev.numel():
            self.kv_indices_dev = torch.cat([self.kv_indices_dev, self.kv_indices_dev.new_zeros(num_pages)])  # expect: FC107
        self.kv_indices_dev[:num_pages].copy_(batch.page_indices, non_blocking=True)  # ok: FC104
        self.kv_lens_dev[:n].copy_(torch.from_numpy(batch.kv_lens_host), non_blocking=True)
        fast_decode_plan(  # ok: FC102
            self.wrappers[bs], indptr=indptr, indices=self.kv_indices_dev, last_page_len=self.last_page_len_host[:bs],
            num_qo_heads=self.cfg.num_qo_heads, num_kv_heads=self.cfg.num_kv_heads, head_dim=self.cfg.head_dim, page_size=ps,
            non_blocking=True,
        )
        # padded rows own no pages
        self.kv_indptr_dev[n + 1 : bs + 1].zero_()  # expect: FC104
        return bs

    def forward_decode(self, bs: int) -> torch.Tensor:
        """The captured body: one decode step of every layer for a bucket of `bs` requests."""
        max_seq_len = self.kv_lens_dev[:bs].max().item()  # expect: FC101
        hidden = self.model.embed(self.input_ids_dev[:bs])
        for layer_id, layer in enumerate(self.model.layers):
            q = layer.project_q(hidden)
            if self.cfg.num_speculative_tokens:
                o = self.verify_wrapper.run(q, self.kv_cache[layer_id])  # expect: FC108
            elif self.cfg.use_xqa_decode:
                o = xqa_batch_decode_with_kv_cache(
                    query=q, kv_cache=self.kv_cache[layer_id], workspace_buffer=self.xqa_workspace, block_tables=self.block_tables_dev[:bs],
                    seq_lens=self.kv_lens_dev[:bs], max_seq_len=max_seq_len,
                )
            else:
                o = self.wrappers[bs].run(q, self.kv_cache[layer_id])  # ok: FC108
            hidden = layer.finish(hidden, o)
        return self.model.logits(hidden)

    def forward_decode_eager(self, n: int) -> torch.Tensor:
        hidden = self.model.embed(self.input_ids_dev[:n])
        for layer_id, layer in enumerate(self.model.layers):
            o = self.eager_wrapper.run(layer.project_q(hidden), self.kv_cache[layer_id])  # ok: FC108
            hidden = layer.finish(hidden, o)
        return self.model.logits(hidden)

    def _eager_step(self, batch: DecodeBatch) -> torch.Tensor:
        ps = self.cfg.page_size
        pages = (batch.kv_lens_host + ps - 1) // ps
        indptr = torch.zeros(batch.size + 1, dtype=torch.int32)
        indptr[1:] = torch.from_numpy(np.cumsum(pages, dtype=np.int32))
        rem = batch.kv_lens_host % ps
        self.eager_wrapper.plan(
            indptr, batch.page_indices, torch.from_numpy(np.where(rem == 0, ps, rem).astype(np.int32)),
            self.cfg.num_qo_heads, self.cfg.num_kv_heads, self.cfg.head_dim, ps,
        )
        self.input_ids_dev[: batch.size].copy_(batch.input_ids, non_blocking=True)
        return self.forward_decode_eager(batch.size)

    def step(self, batch: DecodeBatch) -> torch.Tensor:
        self.transfer.poll()
        n = batch.size
        if n > max(self.cfg.decode_buckets):
            self.transfer.drain()
            return self._eager_step(batch)
        self.transfer.fence(batch.request_ids)
        bs = self.prepare_decode_inputs(batch)
        self.input_ids_dev[:n].copy_(batch.input_ids, non_blocking=True)
        self.graph_pool.graphs[bs].replay()
        return self.graph_pool.outputs[bs][:n]


def decode_loop(instance: DecodeInstance, scheduler) -> Iterator[torch.Tensor]:
    """Yields one step's logits at a time; the server pulls from it between network polls."""
    while (batch := scheduler.next_batch()) is not None:
        yield instance.step(batch)
