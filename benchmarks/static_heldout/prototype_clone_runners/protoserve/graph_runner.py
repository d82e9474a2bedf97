"""One captured decode graph per batch-size bucket, made by cloning a prototype runner.

The engine builds a single ``BucketGraphRunner`` with max-size buffers and the eager
prototype wrappers, then ``for_bucket(bs)`` clones it:

* ``copy.copy`` (``cfg.share_graph_buffers``): the clone shares the prototype's
  ``DecodeBuffers``, input buffers, model and wrapper set; only its graph wrapper is new,
  bound to ``kv_indptr[: bs + 1]`` of the shared buffer.
* ``copy.deepcopy``: ``__deepcopy__`` gives the clone its own buffers and inputs (and, with
  ``cfg.private_wrapper_workspace``, its own wrapper set); model and KV cache stay shared.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from typing import Dict, List, Optional, Tuple

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper

from protoserve.attention.context import AttnContext
from protoserve.attention.wrappers import DecodeWrapperSet
from protoserve.buffers import DecodeBuffers
from protoserve.config import EngineConfig
from protoserve.metadata import SharedPrefixInfo, StepMetadata, for_bucket, rebase
from protoserve.model import TinyDecoder
from protoserve_kernels.trtllm_decode import TrtllmDecodeKernel

logger = logging.getLogger(__name__)


class BucketGraphRunner:
    _GRAPH_INPUTS = ("input_ids", "positions")
    tokens_per_req = 1

    def __init__(
        self,
        cfg: EngineConfig,
        model: TinyDecoder,
        kv_caches: List[torch.Tensor],
        bufs: DecodeBuffers,
        wrappers: DecodeWrapperSet,
        trtllm: Optional[TrtllmDecodeKernel],
        device: torch.device,
    ):
        self.cfg = cfg
        self.model = model
        self.kv_caches = kv_caches
        self.bufs = bufs
        self.wrappers = wrappers
        self.trtllm = trtllm
        self.device = device
        self.bs = 0
        self.graph: Optional[torch.cuda.CUDAGraph] = None
        self.meta_template = StepMetadata.over(bufs)
        self.decode_wrapper: BatchDecodeWithPagedKVCacheWrapper = wrappers.proto
        self.cascade_wrapper = wrappers.cascade
        self.verify_wrapper: Optional[BatchPrefillWithPagedKVCacheWrapper] = None
        max_tokens = cfg.max_batch_size * (cfg.num_speculative_tokens + 1)
        self.input_ids = torch.zeros(max_tokens, dtype=torch.int64, device=device)
        self.positions = torch.zeros(max_tokens, dtype=torch.int64, device=device)
        self.out_logits: Optional[torch.Tensor] = None
        self._plan_info: Optional[Tuple[int, int]] = None  # (bucket, nnz) of the last plan
        self._replay_start = torch.cuda.Event(enable_timing=True)
        self._replay_end = torch.cuda.Event(enable_timing=True)
        self.last_replay_ms = 0.0

    # -- cloning ---------------------------------------------------------------------------

    def __copy__(self) -> "BucketGraphRunner":
        new = type(self).__new__(type(self))
        new.__dict__.update(self.__dict__)
        new.graph = None
        new.out_logits = None
        new._replay_start = torch.cuda.Event(enable_timing=True)
        new._replay_end = torch.cuda.Event(enable_timing=True)
        return new

    def __deepcopy__(self, memo) -> "BucketGraphRunner":
        new = copy.copy(self)
        memo[id(self)] = new
        new.bufs = copy.deepcopy(self.bufs, memo)
        new.meta_template = rebase(self.meta_template, new.bufs)
        new.input_ids = torch.zeros_like(self.input_ids)  # ok: FC107
        new.positions = torch.zeros_like(self.positions)
        if self.cfg.private_wrapper_workspace:
            new.wrappers = copy.deepcopy(self.wrappers, memo)
            new.decode_wrapper = new.wrappers.proto
            new.cascade_wrapper = new.wrappers.cascade
        if self.trtllm is not None:
            new.trtllm = copy.deepcopy(self.trtllm, memo)
        return new

    def for_bucket(self, bs: int) -> "BucketGraphRunner":
        clone = copy.copy(self) if self.cfg.share_graph_buffers else copy.deepcopy(self)
        clone.bs = bs
        clone.decode_wrapper = clone.wrappers.clone_for_bucket(bs, clone.bufs)
        return clone

    def init_graph_buffers(self) -> None:
        self.bufs.kv_last_page_len.fill_(1)  # ok: FC104
        self.bufs.kv_indptr.zero_()

    # -- capture ---------------------------------------------------------------------------

    def _dummy_prefix(self, bs: int) -> SharedPrefixInfo:
        return SharedPrefixInfo(
            qo_indptr_cpu=torch.tensor([0, bs], dtype=torch.int32),
            kv_indptr_cpu=torch.tensor([0, 1], dtype=torch.int32),
            kv_indices=torch.zeros(1, dtype=torch.int32, device=self.device),
            last_page_len_cpu=torch.ones(1, dtype=torch.int32),
        )

    def _dummy_meta(self, bs: int) -> StepMetadata:
        assert bs > 0  # ok: FC109
        meta = for_bucket(self.meta_template, bs, bs)
        meta.kv_indptr_cpu[: bs + 1] = torch.arange(bs + 1, dtype=torch.int32)
        meta.kv_last_page_len_cpu[:bs] = 1
        meta.seq_lens_cpu[:bs] = 1
        meta.page_ids = torch.zeros(bs, dtype=torch.int32, device=self.device)
        if self.cascade_wrapper is not None:
            meta.prefix = self._dummy_prefix(bs)
        meta.max_seq_len = int(self.bufs.seq_lens[:bs].max())  # expect: FC101
        return meta

    def capture(self, graph_pool=None, stream: Optional[torch.cuda.Stream] = None):
        bs = self.bs
        meta = self._dummy_meta(bs)
        self.load_step(meta)
        torch.cuda.synchronize()  # ok: FC101
        for _ in range(2):
            self._forward(bs, meta)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=graph_pool, stream=stream):
            self.out_logits = self._forward(bs, meta)
        self.graph = graph
        logger.info("captured decode graph for bucket %d", bs)
        return graph.pool()

    def _forward(self, bs: int, meta: StepMetadata) -> torch.Tensor:
        if self.cfg.sliding_window_pages:
            self._clip_window(meta, bs)
        attn = AttnContext(
            meta=meta,
            decode_wrapper=self.decode_wrapper,
            cascade_wrapper=self.cascade_wrapper,
            verify_wrapper=self.verify_wrapper,
            trtllm=self.trtllm if self.cfg.use_trtllm_decode else None,
            is_extend=False,
        )
        n = bs * self.tokens_per_req
        return self.model(self.input_ids[:n], self.positions[:n], self.kv_caches, attn)

    def _clip_window(self, meta: StepMetadata, bs: int) -> None:
        """Window layers see at most ``sliding_window_pages`` pages of each request."""
        pages = torch.diff(meta.kv_indptr[: bs + 1]).clamp_(max=self.cfg.sliding_window_pages)
        torch.cumsum(pages, 0, out=meta.kv_indptr[1 : bs + 1])  # expect: FC104

    # -- per step --------------------------------------------------------------------------

    def load_inputs(self, input_ids: torch.Tensor, positions: torch.Tensor) -> None:
        n = input_ids.shape[0]
        self.input_ids[:n].copy_(input_ids, non_blocking=True)
        if positions.dim() == 2:
            # M-RoPE sections come as [3, n]; keep the scheduler's layout
            self.positions = positions.clone()  # expect: FC107
        else:
            self.positions[:n].copy_(positions, non_blocking=True)

    def privatize_inputs(self) -> None:
        """Give a shallow clone inputs of its own (two steps in flight on different buckets)."""
        for name in self._GRAPH_INPUTS:
            setattr(self, name, getattr(self, name).clone())  # expect: FC107

    def load_step(self, meta: StepMetadata) -> None:
        """Copy the step record into this bucket's graph-bound buffers, then plan."""
        bs, bucket = meta.batch_size, self.bs
        nnz = int(meta.kv_indptr_cpu[bucket])  # ok: FC101
        if nnz > self.bufs.kv_indices.numel():
            self.bufs.kv_indices = torch.empty(2 * nnz, dtype=torch.int32, device=self.device)  # expect: FC107
        self.bufs.seq_lens[:bucket].copy_(meta.seq_lens_cpu[:bucket], non_blocking=True)
        self.bufs.kv_indptr[: bucket + 1].copy_(meta.kv_indptr_cpu[: bucket + 1], non_blocking=True)  # ok: FC104
        if meta.page_ids is not None:
            self.bufs.kv_indices[: meta.page_ids.numel()].copy_(meta.page_ids, non_blocking=True)
        self.decode_wrapper.plan(  # ok: FC102
            meta.kv_indptr_cpu[: bucket + 1],
            self.bufs.kv_indices[:nnz],
            meta.kv_last_page_len_cpu[:bucket],
            self.cfg.num_qo_heads,
            self.cfg.num_kv_heads,
            self.cfg.head_dim,
            self.cfg.page_size,
            data_type=self.cfg.kv_dtype,
        )
        if self.cascade_wrapper is not None:
            self._plan_cascade(meta, bucket)
        self._plan_info = (bucket, nnz)  # ok: FC103
        # rows past the live batch attend to nothing
        self.bufs.kv_last_page_len[bs:bucket].zero_()  # expect: FC104

    def _plan_cascade(self, meta: StepMetadata, bucket: int) -> None:
        prefix = meta.prefix
        if prefix is None:
            raise RuntimeError("cascade decode needs the shared prefix of the batch")
        lvl = dataclasses.replace(
            meta, kv_last_page_len=meta.kv_last_page_len_cpu[:bucket].to(self.device, non_blocking=True)
        )
        self.cascade_wrapper.plan(  # expect: FC102
            [prefix.qo_indptr_cpu, torch.arange(bucket + 1, dtype=torch.int32)],
            [prefix.kv_indptr_cpu, meta.kv_indptr_cpu[: bucket + 1]],
            [prefix.kv_indices, self.bufs.kv_indices],
            [prefix.last_page_len_cpu, lvl.kv_last_page_len],
            self.cfg.num_qo_heads,
            self.cfg.num_kv_heads,
            self.cfg.head_dim,
            self.cfg.page_size,
        )

    def replay(self) -> torch.Tensor:
        assert self.graph is not None, "bucket was never captured"  # ok: FC109
        self._replay_start.record()
        self.graph.replay()
        self._replay_end.record()
        # the scheduler's cost model is fed the measured replay time of each bucket
        self._replay_end.synchronize()  # expect: FC101
        self.last_replay_ms = self._replay_start.elapsed_time(self._replay_end)
        return self.out_logits


class VerifyGraphRunner(BucketGraphRunner):
    """Target-verify graphs: each request carries ``num_speculative_tokens + 1`` query rows."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.tokens_per_req = self.cfg.num_speculative_tokens + 1
        max_bs = self.cfg.max_batch_size
        self.qo_indptr = torch.arange(
            0, (max_bs + 1) * self.tokens_per_req, self.tokens_per_req, dtype=torch.int32, device=self.device
        )
        self.num_verify_tokens = 0
        self.window_meta: Optional[StepMetadata] = None

    def for_bucket(self, bs: int) -> "VerifyGraphRunner":
        clone = super().for_bucket(bs)
        # draft rows attend causally among themselves: a prefill wrapper per bucket
        clone.verify_wrapper = copy.deepcopy(clone.wrappers.prefill)
        return clone

    def _dummy_meta(self, bs: int) -> StepMetadata:
        meta = super()._dummy_meta(bs)
        meta.qo_indptr = self.qo_indptr[: bs + 1]
        return meta

    def _clip_window(self, meta: StepMetadata, bs: int) -> None:
        # the verify rows see the window plus their draft page: clip a private copy
        win = dataclasses.replace(meta, kv_indptr=meta.kv_indptr.clone())
        pages = torch.diff(win.kv_indptr[: bs + 1]).clamp_(max=self.cfg.sliding_window_pages + 1)
        torch.cumsum(pages, 0, out=win.kv_indptr[1 : bs + 1])  # ok: FC104
        self.window_meta = win

    def load_step(self, meta: StepMetadata) -> None:
        super().load_step(meta)
        bucket = self.bs
        self.num_verify_tokens = meta.qo_indptr[-1].item()  # expect: FC101
        self.verify_wrapper.plan(  # expect: FC102
            meta.qo_indptr[: bucket + 1],
            meta.kv_indptr_cpu[: bucket + 1],
            self.bufs.kv_indices,
            meta.kv_last_page_len_cpu[:bucket],
            self.cfg.num_qo_heads,
            self.cfg.num_kv_heads,
            self.cfg.head_dim,
            self.cfg.page_size,
            causal=True,
            q_data_type=self.cfg.kv_dtype,
        )


def bucket_table(runners: Dict[int, BucketGraphRunner]) -> List[Tuple[int, bool]]:
    return [(bs, r.graph is not None) for bs, r in sorted(runners.items())]
