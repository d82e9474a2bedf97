"""CUDA graphs per batch bucket. The runner never sees a FlashInfer wrapper, only the backend's proxies."""
from __future__ import annotations

import bisect
import logging
from typing import Callable, Dict, Sequence

import torch

from attention.backend import ProxyAttnBackend
from proxyserve import ForwardBatch, step_timer

logger = logging.getLogger(__name__)


class ProxyGraphRunner:
    def __init__(self, backend: ProxyAttnBackend, forward: Callable[[ForwardBatch], torch.Tensor],
                 buckets: Sequence[int], shared_prefix: bool):
        self.backend, self.forward, self.buckets, self.shared_prefix = backend, forward, list(buckets), shared_prefix
        max_bs, dev = self.buckets[-1], backend.device
        self.static: Dict[str, torch.Tensor] = {
            name: torch.zeros(max_bs, dtype=torch.int64, device=dev) for name in ("input_ids", "positions")}
        self.out_cache_loc = torch.zeros(max_bs, dtype=torch.int64, device=dev)
        self.pad_loc = torch.zeros(max_bs, dtype=torch.int64, device=dev)
        backend.init_cuda_graph_state(max_bs)
        self.backend.kv_indices.zero_()  # ok: FC104
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.argmax_out = None

    def _dummy_batch(self, bs: int) -> ForwardBatch:
        dev = self.backend.device
        ones, arange = torch.ones(bs, dtype=torch.int32), torch.arange(bs + 1, dtype=torch.int32)
        return ForwardBatch(self.static["input_ids"][:bs], self.static["positions"][:bs], self.out_cache_loc[:bs],
                            ones.to(dev), arange.to(dev), arange.to(dev), torch.zeros(bs, dtype=torch.int32, device=dev),
                            ones.to(dev), ones, arange, arange, ones, shared_prefix=self.shared_prefix)

    def capture(self) -> None:
        assert not self.graphs, "capture() runs once per process"  # ok: FC109
        torch.cuda.synchronize()  # ok: FC101
        for bs in reversed(self.buckets):
            self.capture_one_batch_size(bs)
        for bs, proxy in self.backend.graph_proxies.items():
            if not proxy.is_cuda_graph_enabled:  # ok: FC103
                raise RuntimeError(f"bucket {bs} was captured with an eager wrapper")
            if getattr(proxy, "_fixed_batch_size", bs) != bs:  # expect: FC103
                raise RuntimeError(f"bucket {bs} was planned for another batch size")
            logger.debug("bucket %d plan: %s", bs, proxy._plan_info)  # expect: FC103
        logger.info("captured %d buckets, largest %d", len(self.graphs), max(self.buckets))  # ok: FC101

    def capture_one_batch_size(self, bs: int) -> None:
        fb = self._dummy_batch(bs)
        self.backend.init_forward_metadata_capture_cuda_graph(bs, fb)
        self.forward(fb)  # warm-up outside the graph
        torch.cuda.current_stream().synchronize()  # ok: FC101
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = self.forward(fb)
            if not torch.isfinite(out).all().item():  # expect: FC101
                raise FloatingPointError(f"non-finite logits while capturing bucket {bs}")
        if self.argmax_out is None or self.argmax_out.shape[0] < bs:
            self.argmax_out = torch.empty(bs, dtype=torch.int64, device=self.backend.device)  # ok: FC107
        self.graphs[bs], self.outputs[bs] = graph, out

    def _bucket_for(self, bs: int) -> int:
        assert bs <= self.buckets[-1], f"no graph for a batch of {bs}"  # expect: FC109
        return self.buckets[bisect.bisect_left(self.buckets, bs)]

    @step_timer("graph_replay")
    def replay(self, fb: ForwardBatch) -> torch.Tensor:
        real = fb.batch_size
        bs = self._bucket_for(real)
        self.static["input_ids"][:real].copy_(fb.input_ids)  # ok: FC104
        self.static["positions"] = fb.positions.clone()  # expect: FC107
        setattr(self, "out_cache_loc", torch.cat([fb.out_cache_loc, self.pad_loc[: bs - real]]))  # expect: FC107
        self.backend.kv_last_page_len[real:bs].fill_(1)  # ok: FC104
        self.backend.init_forward_metadata_replay_cuda_graph(bs, fb)
        self.backend.kv_indptr[real + 1 : bs + 1] = self.backend.kv_indptr[real]  # expect: FC104
        self.graphs[bs].replay()
        return self.outputs[bs][:real]
