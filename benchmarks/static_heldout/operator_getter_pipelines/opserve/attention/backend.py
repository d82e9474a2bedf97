"""FlashInfer backend: eager and graph-mode decode, sliding-window decode, shared-prefix and prefill."""

from __future__ import annotations

import functools
import itertools
import operator
from typing import TYPE_CHECKING, Dict, List, Tuple

import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
    merge_state,
)
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from opserve.attention.kernels import fill_window_indices
from opserve.attention.planner import PlanCache, decode_plan_args, pages_per_request, plan_decode
from opserve.attention.workspace import empty_workspace, shared_prefix_workspace, zeroed_workspace
from opserve.batch import (
    StepBatch,
    extend_prefix_lens_of,
    extend_seq_lens_cpu_of,
    kv_page_ids_of,
    qo_indptr_of,
    seq_lens_cpu_of,
    seq_lens_of,
)
from opserve.config import PREFILL_WORKSPACE_BYTES, EngineConfig, capture_sizes
from opserve.kv_pool import PagedKVPool

if TYPE_CHECKING:
    from opserve.layers import DecoderLayer
    from opserve.stages import StepContext


class FlashInferPipelineBackend:
    def __init__(self, cfg: EngineConfig, kv_pool: PagedKVPool, device: torch.device):
        self.cfg = cfg
        self.kv_pool = kv_pool
        self.device = device
        self.page_size = cfg.page_size
        self.sliding_window = cfg.sliding_window
        self.shared_prefix_len = cfg.shared_prefix_len
        self.use_trtllm_decode = cfg.use_trtllm_decode
        self.max_context_len = cfg.max_context_len
        self._kv_layout = "NHD"
        self.extend_has_prefix = False
        max_bs = cfg.max_batch_size
        i32 = dict(dtype=torch.int32, device=device)

        # Decode buffers bound to the graph wrappers (rows [0, bs] to bucket bs), and their host mirrors.
        self.kv_indptr = torch.zeros(max_bs + 1, **i32)
        self.kv_indices = torch.zeros(kv_pool.num_pages, **i32)
        self.kv_last_page_len = torch.ones(max_bs, **i32)
        self.kv_indptr_host = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_len_host = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.qo_indptr_host = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.qo_arange = torch.arange(max_bs + 1, **i32)

        # Sliding-window decode keeps its own page list, planned eagerly every step.
        self.window_indptr = torch.zeros(max_bs + 1, **i32)
        self.window_indices = torch.zeros(max_bs * cfg.window_pages(), **i32)
        self.window_last_page_len = torch.ones(max_bs, **i32)

        # trtllm-gen decode has no planner: it reads block tables and lengths directly.
        self.block_tables = torch.zeros(max_bs, cfg.max_pages_per_request(), **i32)
        self.trtllm_seq_lens = torch.ones(max_bs, **i32)

        # A shared system prompt: the same prefix pages for every request.
        self.prefix_pages = -(-cfg.shared_prefix_len // cfg.page_size)
        self.prefix_indices = torch.arange(self.prefix_pages, **i32).repeat(max_bs)
        self.prefix_indptr_host = torch.arange(max_bs + 1, dtype=torch.int32) * self.prefix_pages
        prefix_last = cfg.shared_prefix_len - max(self.prefix_pages - 1, 0) * cfg.page_size
        self.prefix_last_page_len_host = torch.full((max_bs,), prefix_last, dtype=torch.int32)

        self.decode_workspace, self.window_workspace = map(
            functools.partial(empty_workspace, device=device),
            (cfg.decode_workspace_bytes(), cfg.window_workspace_bytes()),
        )
        self.trtllm_workspace = zeroed_workspace(cfg.trtllm_workspace_bytes, device)
        self.prefill_workspace = torch.zeros(PREFILL_WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.extend_workspace = torch.zeros(cfg.extend_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC106

        self.eager_decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.decode_workspace, self._kv_layout)
        self.window_decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(
            self.window_workspace, self._kv_layout, backend="trtllm-gen" if cfg.sm_major >= 10 else "fa2"
        )
        self.ragged_prefill_wrapper = BatchPrefillWithRaggedKVCacheWrapper(self.prefill_workspace, self._kv_layout)
        self.extend_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.extend_workspace, self._kv_layout)
        self.shared_prefix_wrapper = BatchPrefillWithPagedKVCacheWrapper(
            shared_prefix_workspace(device), self._kv_layout
        )
        self.graph_decode_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.plan_cache = PlanCache()

    def all_wrappers(self) -> List[object]:
        return [
            self.eager_decode_wrapper,
            self.window_decode_wrapper,
            self.ragged_prefill_wrapper,
            self.extend_wrapper,
            self.shared_prefix_wrapper,
            *self.graph_decode_wrappers.values(),
        ]

    # ------------------------------------------------------------------ graph set-up

    def init_cuda_graph_state(self, max_bs: int) -> None:
        self.kv_last_page_len.fill_(1)  # ok: FC104
        sizes = capture_sizes(max_bs)
        self.graph_decode_wrappers = dict(zip(sizes, map(self._make_graph_wrapper, sizes)))
        self._check_layouts()

    def _make_graph_wrapper(self, bs: int) -> BatchDecodeWithPagedKVCacheWrapper:
        return BatchDecodeWithPagedKVCacheWrapper(
            self.decode_workspace,
            self._kv_layout,
            use_cuda_graph=True,
            paged_kv_indptr_buffer=self.kv_indptr[: bs + 1],
            paged_kv_indices_buffer=self.kv_indices,
            paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs],
        )

    def _check_layouts(self) -> None:
        layouts = set(map(operator.attrgetter("_kv_layout"), self.graph_decode_wrappers.values()))  # expect: FC103
        if layouts - {self._kv_layout}:
            raise RuntimeError(f"graph wrappers disagree on the KV layout: {sorted(layouts)}")
        if not all(map(operator.attrgetter("is_cuda_graph_enabled"), self.graph_decode_wrappers.values())):  # ok: FC103
            raise RuntimeError("a graph decode wrapper was built without use_cuda_graph=True")

    # ------------------------------------------------------------------ per-step metadata

    def init_forward_metadata(self, batch: StepBatch) -> None:
        if batch.is_decode:
            self._prepare_decode(batch)
        else:
            self._prepare_extend(batch)

    def _fill_decode_pages(self, batch: StepBatch, raw_bs: int, bs: int) -> int:
        """Host indptr / last-page lengths, and the page list into the bound indices. Rows past
        ``raw_bs`` are padding: one page each, the reserved page 0."""
        lens_host = seq_lens_cpu_of(batch)
        self.kv_indptr_host[1 : raw_bs + 1] = torch.cumsum(pages_per_request(lens_host, self.page_size), 0)
        total = int(self.kv_indptr_host[raw_bs])
        pad = bs - raw_bs
        self.kv_indptr_host[raw_bs + 1 : bs + 1] = total + torch.arange(1, pad + 1, dtype=torch.int32)
        self.kv_last_page_len_host[:raw_bs] = (lens_host - 1) % self.page_size + 1
        self.kv_last_page_len_host[raw_bs:bs] = 1
        self.kv_indices[:total].copy_(kv_page_ids_of(batch)[:total], non_blocking=True)  # ok: FC104
        self.kv_indices[total : total + pad].zero_()
        return total + pad

    def _prepare_decode(self, batch: StepBatch) -> None:
        bs = batch.batch_size
        n = self._fill_decode_pages(batch, bs, bs)
        args = decode_plan_args(
            self.cfg, self.kv_indptr_host[: bs + 1], self.kv_indices[:n], self.kv_last_page_len_host[:bs], bs
        )
        plan_decode(self.eager_decode_wrapper, args)
        self._plan_aux(batch, bs)

    def _plan_aux(self, batch: StepBatch, bs: int) -> None:
        if self.sliding_window:
            self._plan_window(batch)
        if self.shared_prefix_len:
            self._plan_shared_prefix(bs)
        if self.use_trtllm_decode:
            self._fill_block_tables(batch, bs)

    def _plan_window(self, batch: StepBatch) -> None:
        cfg = self.cfg
        bs = batch.batch_size
        seq_lens = seq_lens_of(batch)
        first_page = torch.clamp(seq_lens - self.sliding_window, min=0) // self.page_size
        last_page = (seq_lens - 1) // self.page_size
        torch.cumsum(last_page - first_page + 1, 0, out=self.window_indptr[1 : bs + 1])
        self.window_last_page_len[:bs] = (seq_lens - 1) % self.page_size + 1
        fill_window_indices(
            self.window_indices,
            self.kv_pool.req_to_page,
            batch.req_pool_indices,
            seq_lens,
            self.window_indptr,
            self.page_size,
            self.sliding_window,
        )
        operator.methodcaller(  # expect: FC102
            "plan",
            self.window_indptr[: bs + 1],
            self.window_indices,
            self.window_last_page_len[:bs],
            cfg.num_qo_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            self.page_size,
            window_left=self.sliding_window - 1,
            q_data_type=cfg.dtype,
            kv_data_type=cfg.kv_dtype,
        )(self.window_decode_wrapper)

    def _plan_shared_prefix(self, bs: int) -> None:
        cfg = self.cfg
        n = bs * self.prefix_pages
        self.shared_prefix_wrapper.plan(  # expect: FC102
            self.qo_arange[: bs + 1],
            self.prefix_indptr_host[: bs + 1],
            self.prefix_indices[:n],
            self.prefix_last_page_len_host[:bs],
            cfg.num_qo_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            self.page_size,
            causal=False,
            q_data_type=cfg.dtype,
            kv_data_type=cfg.kv_dtype,
        )

    def _fill_block_tables(self, batch: StepBatch, bs: int) -> None:
        raw_bs = batch.batch_size
        max_pages = int(pages_per_request(seq_lens_cpu_of(batch), self.page_size).max())
        if max_pages > self.block_tables.shape[1]:
            self.block_tables = torch.zeros(self.block_tables.shape[0], max_pages, dtype=torch.int32, device=self.device)  # expect: FC107
        rows = self.kv_pool.req_to_page[batch.req_pool_indices, :max_pages]
        self.block_tables[:raw_bs, :max_pages].copy_(rows)
        self.trtllm_seq_lens[:raw_bs].copy_(seq_lens_of(batch))
        self.trtllm_seq_lens[raw_bs:bs].fill_(1)

    def _prepare_extend(self, batch: StepBatch) -> None:
        cfg = self.cfg
        bs = batch.batch_size
        prefix_lens = extend_prefix_lens_of(batch).tolist()  # expect: FC101
        extend_lens = extend_seq_lens_cpu_of(batch).tolist()  # ok: FC101
        self.qo_indptr_host = torch.zeros(bs + 1, dtype=torch.int32, pin_memory=True)  # ok: FC107
        self.qo_indptr_host[1:] = torch.tensor(list(itertools.accumulate(extend_lens)), dtype=torch.int32)
        plan_ragged = functools.partial(
            self.ragged_prefill_wrapper.plan,
            num_qo_heads=cfg.num_qo_heads,
            num_kv_heads=cfg.num_kv_heads,
            head_dim_qk=cfg.head_dim,
            causal=True,
            q_data_type=cfg.dtype,
        )
        plan_ragged(qo_indptr_of(batch), qo_indptr_of(batch))  # expect: FC102
        self.extend_has_prefix = any(prefix_lens)
        if not self.extend_has_prefix:
            return
        prefix_host = torch.tensor(prefix_lens, dtype=torch.int32)
        self.kv_indptr_host[1 : bs + 1] = torch.cumsum(pages_per_request(prefix_host, self.page_size), 0)
        self.kv_last_page_len_host[:bs] = torch.where(prefix_host > 0, (prefix_host - 1) % self.page_size + 1, 0)
        n = int(self.kv_indptr_host[bs])
        self.kv_indices[:n].copy_(kv_page_ids_of(batch)[:n], non_blocking=True)
        plan_paged = functools.partial(
            self.extend_wrapper.plan,
            num_qo_heads=cfg.num_qo_heads,
            num_kv_heads=cfg.num_kv_heads,
            head_dim_qk=cfg.head_dim,
            page_size=self.page_size,
            causal=False,
            q_data_type=cfg.dtype,
            kv_data_type=cfg.kv_dtype,
        )
        plan_paged(  # ok: FC102
            self.qo_indptr_host,
            self.kv_indptr_host[: bs + 1],
            self.kv_indices[:n],
            self.kv_last_page_len_host[:bs],
        )

    # ------------------------------------------------------------------ graph capture and replay

    def init_forward_metadata_capture_cuda_graph(self, bs: int, batch: StepBatch) -> None:
        n = self._fill_decode_pages(batch, bs, bs)
        self._plan_aux(batch, bs)
        w = operator.itemgetter(bs)(self.graph_decode_wrappers)
        plan_decode(
            w,
            decode_plan_args(
                self.cfg, self.kv_indptr_host[: bs + 1], self.kv_indices[:n], self.kv_last_page_len_host[:bs], bs
            ),
        )

    def init_forward_metadata_replay_cuda_graph(self, bs: int, batch: StepBatch) -> None:
        raw_bs = batch.batch_size
        n = self._fill_decode_pages(batch, raw_bs, bs)
        self._plan_aux(batch, bs)
        w = operator.itemgetter(bs)(self.graph_decode_wrappers)
        key: Tuple[int, int] = (raw_bs, n)
        if self.plan_cache.unchanged(bs, key) and operator.attrgetter("_plan_info")(w) is not None:  # expect: FC103
            return
        w.plan(  # ok: FC102
            self.kv_indptr_host[: bs + 1],
            self.kv_indices[:n],
            self.kv_last_page_len_host[:bs],
            self.cfg.num_qo_heads,
            self.cfg.num_kv_heads,
            self.cfg.head_dim,
            self.page_size,
            q_data_type=self.cfg.dtype,
            kv_data_type=self.cfg.kv_dtype,
        )
        self.plan_cache.record(bs, key)
        # Padded rows attend to nothing.
        self.kv_last_page_len[raw_bs:bs].zero_()  # expect: FC104
        self.kv_indptr_host[bs + 1 :].zero_()  # ok: FC104

    # ------------------------------------------------------------------ forward

    def store_kv(self, layer: "DecoderLayer", k: torch.Tensor, v: torch.Tensor, loc: torch.Tensor) -> None:
        self.kv_pool.set_kv(layer.layer_id, loc, k, v)

    def forward_decode(self, q: torch.Tensor, layer: "DecoderLayer", ctx: "StepContext") -> torch.Tensor:
        kv = self.kv_pool.kv_buffer(layer.layer_id)
        if layer.sliding_window:
            return operator.methodcaller("run", q, kv)(self.window_decode_wrapper)  # expect: FC108
        if self.use_trtllm_decode:
            bs = q.shape[0]
            bmm1_scale, bmm2_scale = operator.itemgetter(layer.layer_id)(ctx.bmm_scales)
            return trtllm_batch_decode_with_kv_cache(
                query=q,
                kv_cache=kv,
                workspace_buffer=self.trtllm_workspace,
                block_tables=self.block_tables[:bs],
                seq_lens=self.trtllm_seq_lens[:bs],
                max_seq_len=ctx.max_seq_len,
                bmm1_scale=bmm1_scale,
                bmm2_scale=bmm2_scale,
            )
        if ctx.graph_bs is None:
            w = self.eager_decode_wrapper
        else:
            w = operator.itemgetter(ctx.graph_bs)(self.graph_decode_wrappers)
        if not self.shared_prefix_len:
            return w.run(q, kv)  # ok: FC108
        o, lse = w.run(q, kv, return_lse=True)
        o_prefix, lse_prefix = self.shared_prefix_wrapper.run_return_lse(q, kv)  # expect: FC108
        merged, _ = merge_state(o_prefix, lse_prefix, o, lse)
        return merged

    def forward_extend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: "DecoderLayer", ctx: "StepContext"
    ) -> torch.Tensor:
        if not self.extend_has_prefix:
            return self.ragged_prefill_wrapper.run(q, k, v)  # ok: FC108
        o_new, lse_new = self.ragged_prefill_wrapper.run_return_lse(q, k, v)
        o_prefix, lse_prefix = self.extend_wrapper.run_return_lse(q, self.kv_pool.kv_buffer(layer.layer_id))
        merged, _ = merge_state(o_prefix, lse_prefix, o_new, lse_new)
        return merged
