"""Decode CUDA graphs, one per padded batch size, reading the ``attn_state`` buffers."""

from __future__ import annotations

import bisect
import functools
import logging
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

import torch

from modserve.batch import ForwardBatch
from modserve.layers.buffers import GraphInputBuffers
from modserve.runtime.hooks import refresh_layer_meta

if TYPE_CHECKING:
    from modserve.runtime.model_runner import ModelRunner

logger = logging.getLogger(__name__)


class CudaGraphRunner:
    def __init__(self, model_runner: "ModelRunner"):
        self.model_runner = model_runner
        self.model = model_runner.model
        self.attn_backend = model_runner.attn_backend
        self.host = model_runner.host
        self.device = model_runner.device
        self.inputs: GraphInputBuffers = self.model.get_submodule("attn_state")
        self.capture_bs: List[int] = sorted(
            bs for bs in model_runner.cfg.cuda_graph_sizes if bs <= self.inputs.max_bs
        )
        self.max_bs = self.capture_bs[-1]
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, Tuple[torch.Tensor, Optional[torch.Tensor]]] = {}
        self.pool = None
        self._captured = False
        self.seen_kv_lens: List[int] = []
        self.attn_backend.init_cuda_graph_state(self.inputs)
        self.warm_and_record()

    # ------------------------------------------------------------------ capture

    def warm_and_record(self) -> None:
        for bs in reversed(self.capture_bs):
            self.record_bucket(bs)
        for bs, w in self.attn_backend.decode_graph_wrappers.items():
            if not w._use_cuda_graph:  # expect: FC103
                raise RuntimeError(f"decode wrapper for bs={bs} was built outside CUDA-graph mode")
        self._captured = True
        logger.info("captured %d decode graphs: %s", len(self.graphs), self.capture_bs)

    def record_bucket(self, bs: int) -> None:
        state = self.inputs
        fb = ForwardBatch(
            batch_size=bs,
            input_ids=state.input_ids[:bs],
            positions=state.positions[:bs],
            seq_lens=state.seq_lens[:bs],
            seq_lens_cpu=self.host.seq_lens[:bs],
            req_pool_indices=state.req_pool_indices[:bs],
            out_cache_loc=state.out_cache_loc[:bs],
            is_decode=True,
            use_graph=True,
            num_tokens=bs,
        )
        self.attn_backend.init_forward_metadata_capture_cuda_graph(bs, fb)
        self.model.apply(functools.partial(refresh_layer_meta, fb=fb))
        for _ in range(2):
            torch.cuda.synchronize()  # ok: FC101
            self.model(fb.input_ids, fb.positions, fb)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = self.model(fb.input_ids, fb.positions, fb)
        self.pool = graph.pool()
        self.graphs[bs] = graph
        self.outputs[bs] = out

    # ------------------------------------------------------------------ replay

    def can_run(self, fb: ForwardBatch) -> bool:
        return self._captured and fb.is_decode and fb.batch_size <= self.max_bs

    def replay_prepare(self, fb: ForwardBatch) -> int:
        raw_bs = fb.batch_size
        bs = self.capture_bs[bisect.bisect_left(self.capture_bs, raw_bs)]
        bufs = self.inputs._buffers  # ok: FC103
        if bufs["req_pool_indices"].numel() < bs:
            bufs["req_pool_indices"] = torch.zeros(bs, dtype=torch.int64, device=self.device)  # expect: FC107
        if bs != raw_bs:
            bufs["seq_lens"][raw_bs:bs].fill_(1)
            bufs["out_cache_loc"][raw_bs:bs].zero_()
            bufs["req_pool_indices"][raw_bs:bs].zero_()
        bufs["input_ids"][:raw_bs].copy_(fb.input_ids)
        bufs["positions"][:raw_bs].copy_(fb.positions)
        bufs["seq_lens"][:raw_bs].copy_(fb.seq_lens)
        bufs["req_pool_indices"][:raw_bs].copy_(fb.req_pool_indices)
        bufs["out_cache_loc"][:raw_bs].copy_(fb.out_cache_loc)
        self.seen_kv_lens.extend(fb.seq_lens_cpu[:raw_bs].tolist())  # ok: FC101
        padded = self.inputs.slot("seq_lens", bs).tolist()  # expect: FC101
        logger.debug("replay bucket %d kv lens %s", bs, padded)
        self.attn_backend.init_forward_metadata_replay_cuda_graph(bs, raw_bs, fb)
        # padded rows hold no tokens
        bufs["kv_last_page_len"][raw_bs:bs].zero_()  # expect: FC104
        bufs["positions"][raw_bs:bs].zero_()  # ok: FC104
        self.inputs.live_bs = raw_bs
        return bs

    def replay(self, fb: ForwardBatch):
        assert self._captured, "replay() before the graphs were recorded"  # ok: FC109
        raw_bs = fb.batch_size
        bs = self.replay_prepare(fb)
        # drop the rows a previous, larger batch left behind
        for name, buf in self.inputs.named_buffers():
            if name == "kv_indptr":
                buf[raw_bs + 1 :].zero_()  # expect: FC104
        self.graphs[bs].replay()
        logits, draft = self.outputs[bs]
        return logits[:raw_bs], (draft[:raw_bs] if draft is not None else None)
