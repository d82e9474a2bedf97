"""FlashInfer attention backend.

Per-step metadata are immutable: the eager decode metadata are a `dataclasses.replace` of a
prototype, each CUDA-graph bucket keeps the snapshot it was captured with, and a replay works on a
`copy.copy` of that snapshot (same graph-bound tensors, new host-side values).
"""

from __future__ import annotations

import copy
import logging
from dataclasses import asdict, astuple, fields, replace
from typing import Dict, Optional

import torch
import torch.nn.functional as F
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
    merge_state,
    trtllm_batch_decode_with_kv_cache,
)

from snapattn.workspace import float_workspace, trtllm_workspace_bytes, zeroed_workspace
from snapserve.batch import BatchState
from snapserve.config import DRAFT_WORKSPACE_BYTES, EngineConfig
from snapserve.metadata import (
    BlockTableView,
    DecodeMetadata,
    DecodePlanArgs,
    DraftMeta,
    PrefillPlan,
    PrefillPlanArgs,
)

try:  # compiled helper that compacts each request's window pages into `out`
    from snap_kernels import window_kv_indices
except ImportError:  # pragma: no cover - CPU-only test environments
    window_kv_indices = None

logger = logging.getLogger(__name__)


def _check_snapshot(meta: DecodeMetadata) -> None:
    """Reject negative indices before they reach the kernels."""
    for f in fields(meta):
        value = getattr(meta, f.name)
        if isinstance(value, torch.Tensor) and value.numel() and bool((value < 0).any()):  # expect: FC101
            raise ValueError(f"negative entries in {f.name}: {value}")  # ok: FC101


class FlashInferBackend:
    def __init__(self, cfg: EngineConfig, device: torch.device):
        self.cfg = cfg.resolved()
        self.device = device
        self._kv_layout = "NHD"
        self._backend = self.cfg.decode_backend
        ws_bytes = self.cfg.planner_workspace_bytes()

        self.workspace = float_workspace(self.cfg, device)
        self.decode_workspace = torch.empty(ws_bytes, dtype=torch.uint8, device=device)  # expect: FC105
        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(
            self.decode_workspace, self._kv_layout, backend=self.cfg.decode_backend
        )
        self.window_workspace = torch.empty(ws_bytes // 2, dtype=torch.uint8, device=device)  # ok: FC105
        self.window_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.window_workspace, self._kv_layout, backend="fa2")
        self.window_indices = torch.zeros(self.cfg.max_total_pages, dtype=torch.int32, device=device)
        # speculative decoding: last-page lengths of the accepted prefix, never bound to a wrapper
        self.spec_last_page_scratch = torch.ones(self.cfg.max_num_reqs, dtype=torch.int32, device=device)

        self.prefill_workspace = torch.empty(self.cfg.prefill_workspace_bytes, dtype=torch.uint8, device=device)  # ok: FC106
        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, self._kv_layout)
        self.ragged_wrapper = BatchPrefillWithRaggedKVCacheWrapper(self.prefill_workspace, self._kv_layout)

        self.draft_workspace = torch.empty(DRAFT_WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.draft_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.draft_workspace, self._kv_layout)

        self.trt_workspace = zeroed_workspace(trtllm_workspace_bytes(self.cfg), str(device))

        empty_dev = torch.empty(0, dtype=torch.int32, device=device)
        empty_host = torch.empty(0, dtype=torch.int32, device="cpu", pin_memory=True)
        self._decode_proto = DecodeMetadata(
            num_reqs=0,
            kv_indptr=empty_dev,
            kv_indices=empty_dev,
            kv_last_page_len=empty_dev,
            seq_lens=empty_dev,
            kv_indptr_cpu=empty_host,
            kv_last_page_len_cpu=empty_host,
            seq_lens_cpu=empty_host,
            wrapper=self.decode_wrapper,
        )
        self._draft_proto = DraftMeta(
            wrapper=self.draft_wrapper,
            kv_indptr=empty_dev,
            kv_indices=empty_dev,
            kv_last_page_len=empty_dev,
            kv_indptr_cpu=empty_host,
            kv_last_page_len_cpu=empty_host,
        )

        self.kv_indptr_buf: Optional[torch.Tensor] = None
        self.captured: Dict[int, DecodeMetadata] = {}
        self.captured_draft: Dict[int, DraftMeta] = {}
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.forward_meta: Optional[DecodeMetadata] = None
        self.draft_meta: Optional[DraftMeta] = None
        self.prefill_plan: Optional[PrefillPlan] = None
        self.stats: Dict[str, int] = {"prefill_tokens": 0, "scheduled_tokens": 0}

    # ------------------------------------------------------------------ graph state

    def init_cuda_graph_state(self, max_bs: int) -> None:
        i32 = dict(dtype=torch.int32, device=self.device)
        self.kv_indptr_buf = torch.zeros(max_bs + 1, **i32)
        self.kv_indices_buf = torch.zeros(self.cfg.max_total_pages, **i32)
        self.last_page_len_buf = torch.ones(max_bs, **i32)
        self.seq_lens_buf = torch.ones(max_bs, **i32)
        pin = dict(dtype=torch.int32, device="cpu", pin_memory=True)
        self.kv_indptr_host = torch.zeros(max_bs + 1, **pin)
        self.last_page_len_host = torch.ones(max_bs, **pin)
        self.seq_lens_host = torch.ones(max_bs, **pin)

    # ------------------------------------------------------------------ eager metadata

    def init_forward_metadata(self, batch: BatchState) -> None:
        if batch.is_decode:
            self.forward_meta = self._decode_meta(batch)
        else:
            self.prefill_plan = self._prefill_meta(batch)

    def _decode_meta(self, batch: BatchState) -> DecodeMetadata:
        n = batch.num_reqs
        meta = replace(
            self._decode_proto,
            num_reqs=n,
            kv_indptr=batch.kv_indptr[: n + 1],
            kv_indices=batch.kv_indices,
            kv_last_page_len=batch.kv_last_page_len[:n],
            seq_lens=batch.seq_lens[:n],
            kv_indptr_cpu=batch.kv_indptr_cpu[: n + 1],
            kv_last_page_len_cpu=batch.kv_last_page_len_cpu[:n],
            seq_lens_cpu=batch.seq_lens_cpu[:n],
        )
        args = DecodePlanArgs.from_meta(meta, self.cfg)
        meta.wrapper.plan(*astuple(args))  # ok: FC102

        if self.cfg.sliding_window > 0:
            win = self._window_args(meta, args)
            self.window_wrapper.plan(  # expect: FC102
                **{f.name: getattr(win, f.name) for f in fields(win)},
                window_left=self.cfg.sliding_window,
            )
        if self.cfg.enable_draft:
            # each draft step appends one token: the last page grows by one (or starts a new page)
            dargs = replace(args, last_page_len=meta.kv_last_page_len % self.cfg.page_size + 1)
            self.draft_wrapper.plan(**asdict(dargs))  # expect: FC102
            self.draft_meta = self._draft_proto._replace(
                kv_indptr=meta.kv_indptr,
                kv_indices=meta.kv_indices,
                kv_last_page_len=dargs.last_page_len,
                num_reqs=n,
            )
        return meta

    def _window_args(self, meta: DecodeMetadata, args: DecodePlanArgs) -> DecodePlanArgs:
        """Clip every request to its last `sliding_window + 1` tokens (computed where the lengths live)."""
        page = self.cfg.page_size
        win_lens = torch.clamp(meta.seq_lens, max=self.cfg.sliding_window + 1)
        win_pages = (win_lens + page - 1) // page
        win_indptr = F.pad(torch.cumsum(win_pages, 0, dtype=torch.int32), (1, 0))
        first_page = torch.diff(meta.kv_indptr) - win_pages
        if window_kv_indices is not None:
            window_kv_indices(meta.kv_indices, meta.kv_indptr, first_page, win_indptr, self.window_indices)
        return replace(args, indptr=win_indptr, indices=self.window_indices)

    def _prefill_meta(self, batch: BatchState) -> PrefillPlan:
        n = batch.num_reqs
        cfg = self.cfg
        plan = PrefillPlan(
            qo_indptr=batch.qo_indptr_cpu[: n + 1],
            kv_indptr=batch.kv_indptr_cpu[: n + 1],
            kv_indices=batch.kv_indices,
            last_page_len=batch.kv_last_page_len_cpu[:n],
            num_tokens=batch.num_tokens,
        )
        pargs = PrefillPlanArgs(*plan[:4], cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim, cfg.page_size)
        self.prefill_wrapper.plan(*astuple(pargs), causal=plan.causal)  # ok: FC102

        # the new tokens attend to each other through the ragged wrapper: kv rows are the qo rows
        ragged = plan._replace(kv_indptr=batch.qo_indptr[: n + 1])
        self.ragged_wrapper.plan(ragged.qo_indptr, ragged.kv_indptr, cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim, causal=True)  # expect: FC102

        self.stats["scheduled_tokens"] += int(plan.num_tokens)  # ok: FC101
        if batch.has_prefix_hits:
            # the GPU radix matcher wrote how many leading tokens of each prompt were already cached
            hit = plan._replace(num_tokens=plan.num_tokens - batch.prefix_hit_lens[:n].sum())
            self.stats["prefill_tokens"] += int(hit.num_tokens)  # expect: FC101
        return plan

    # ------------------------------------------------------------------ CUDA graphs

    def init_forward_metadata_capture_cuda_graph(self, bs: int) -> DecodeMetadata:
        assert self.kv_indptr_buf is not None, "init_cuda_graph_state() must run before capture"  # ok: FC109
        bound = replace(
            self._decode_proto,
            num_reqs=bs,
            kv_indptr=self.kv_indptr_buf[: bs + 1],
            kv_indices=self.kv_indices_buf,
            kv_last_page_len=self.last_page_len_buf[:bs],
            seq_lens=self.seq_lens_buf[:bs],
            kv_indptr_cpu=self.kv_indptr_host[: bs + 1],
            kv_last_page_len_cpu=self.last_page_len_host[:bs],
            seq_lens_cpu=self.seq_lens_host[:bs],
            bucket=bs,
        )
        wrapper = BatchDecodeWithPagedKVCacheWrapper(
            self.workspace,
            self._kv_layout,
            use_cuda_graph=True,
            paged_kv_indptr_buffer=bound.kv_indptr,
            paged_kv_indices_buffer=bound.kv_indices,
            paged_kv_last_page_len_buffer=bound.kv_last_page_len,
        )
        self.graph_wrappers[bs] = wrapper
        # dummy batch for the capture: one page per request
        self.kv_indptr_host[: bs + 1] = torch.arange(bs + 1, dtype=torch.int32)
        self.last_page_len_host[:bs] = 1
        self.seq_lens_host[:bs] = 1

        snap = replace(bound, wrapper=wrapper)
        snap.wrapper.plan(*astuple(DecodePlanArgs.from_meta(snap, self.cfg)))  # ok: FC102
        logger.info(f"decode bucket {bs}: planned with seq_lens={snap.seq_lens}")  # expect: FC101
        self.captured[bs] = replace(snap, plan_info=snap.wrapper._plan_info)  # expect: FC103

        if self.cfg.enable_draft:
            draft = self._draft_proto._replace(
                kv_indptr=bound.kv_indptr,
                kv_indices=bound.kv_indices,
                kv_last_page_len=bound.kv_last_page_len,
                kv_indptr_cpu=bound.kv_indptr_cpu,
                kv_last_page_len_cpu=bound.kv_last_page_len_cpu,
                num_reqs=bs,
            )
            dargs = DecodePlanArgs(
                indptr=draft.kv_indptr_cpu,
                indices=draft.kv_indices,
                last_page_len=draft.kv_last_page_len_cpu,
                num_qo_heads=self.cfg.num_qo_heads,
                num_kv_heads=self.cfg.num_kv_heads,
                head_dim=self.cfg.head_dim,
                page_size=self.cfg.page_size,
            )
            draft.wrapper.plan(**asdict(dargs))  # ok: FC102
            self.captured_draft[bs] = draft
        return self.captured[bs]

    def init_forward_metadata_replay_cuda_graph(self, bs: int, batch: BatchState) -> DecodeMetadata:
        n = batch.num_reqs
        nnz = batch.num_pages_host()
        if nnz + bs > self.kv_indices_buf.numel():
            self.kv_indices_buf = torch.empty(2 * (nnz + bs), dtype=torch.int32, device=self.device)  # expect: FC107
        cur = copy.copy(self.captured[bs])

        # host mirrors: the real rows, then one dummy page per padded row
        self.kv_indptr_host[: n + 1] = batch.kv_indptr_cpu[: n + 1]
        self.kv_indptr_host[n + 1 : bs + 1] = nnz + torch.arange(1, bs - n + 1, dtype=torch.int32)
        self.last_page_len_host[:n] = batch.kv_last_page_len_cpu[:n]
        self.last_page_len_host[n:bs] = 1
        self.seq_lens_host[:n] = batch.seq_lens_cpu[:n]
        self.seq_lens_host[n:bs] = 1

        cur.kv_indices[:nnz].copy_(batch.kv_indices[:nnz], non_blocking=True)  # ok: FC104
        cur.seq_lens.copy_(self.seq_lens_host[:bs], non_blocking=True)
        _check_snapshot(cur)
        max_len = int(cur.seq_lens_cpu.max())  # ok: FC101

        cur.wrapper.plan(*astuple(DecodePlanArgs.from_meta(cur, self.cfg)))  # ok: FC102
        cur.kv_last_page_len[n:bs].fill_(1)  # expect: FC104
        cur = replace(cur, num_reqs=n, plan_info={"max_seq_len": max_len, "bucket": bs})
        self.forward_meta = cur
        return cur

    # ------------------------------------------------------------------ attention

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, meta: DecodeMetadata, layer_id: int) -> torch.Tensor:
        if self.cfg.is_window_layer(layer_id):
            win = replace(meta, wrapper=self.window_wrapper)
            return win.wrapper.run(q, kv_cache)  # expect: FC108
        return meta.wrapper.run(q, kv_cache)  # ok: FC108

    def forward_draft(self, q: torch.Tensor, kv_cache: torch.Tensor, draft: DraftMeta) -> torch.Tensor:
        return draft.wrapper.run(q, kv_cache)  # expect: FC108

    def forward_extend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        o_new, lse_new = self.ragged_wrapper.run_return_lse(q, k, v)
        o_old, lse_old = self.prefill_wrapper.run_return_lse(q, kv_cache)  # ok: FC108
        out, _ = merge_state(o_new, lse_new, o_old, lse_old)
        return out

    def forward_decode_overflow(self, q: torch.Tensor, kv_cache: torch.Tensor, view: BlockTableView) -> torch.Tensor:
        """Batches above the largest graph bucket: trtllm-gen decode straight from the block table."""
        max_len = view.max_seq_len()
        launched = view.remember_launch(max_len)
        return trtllm_batch_decode_with_kv_cache(
            query=q,
            kv_cache=kv_cache,
            workspace_buffer=self.trt_workspace,
            block_tables=launched.block_table,
            seq_lens=launched.seq_lens,
            max_seq_len=max_len,
            bmm1_scale=self.cfg.head_dim ** -0.5,
            bmm2_scale=1.0,
        )

    # ------------------------------------------------------------------ introspection

    def debug_state(self) -> Dict[int, bool]:
        """For each bucket: does its snapshot still view the buffers its wrapper was bound to?"""
        return {
            bs: snap.wrapper._paged_kv_indptr_buf.data_ptr() == snap.kv_indptr.data_ptr()  # expect: FC103
            for bs, snap in self.captured.items()
        }

    def describe(self) -> str:
        return f"FlashInferBackend(layout={self._kv_layout}, decode={self._backend}, buckets={sorted(self.captured)})"  # ok: FC103
