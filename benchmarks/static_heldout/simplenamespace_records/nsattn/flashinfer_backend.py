"""FlashInfer attention backend.

Eager wrappers (decode, ragged + paged prefill, sliding-window decode per batch size, MTP draft,
speculative verify) plan every step from the step record; graph-mode decode wrappers, one per
captured bucket, are bound to rows of ``self.graph_bufs`` (a ``SimpleNamespace`` of device buffers)
and re-planned before every replay.  Metadata are ``SimpleNamespace`` copies of the step record
(``make_meta(**vars(rec))``) that the planners extend in place.
"""

from __future__ import annotations

import logging
from collections import ChainMap
from types import SimpleNamespace
from typing import Any

import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
    merge_state,
)

from nsattn.plan_kwargs import (
    decode_plan_kwargs,
    graph_wrapper_kwargs,
    paged_prefill_common,
    ragged_plan_kwargs,
    static_decode_kwargs,
)
from nsattn.trtllm_decode import TrtllmDecodePath
from nsserve import config as nscfg
from nsserve.caches import workspace_for
from nsserve.records import make_meta, update_record

logger = logging.getLogger(__name__)

# Constructor defaults of the auxiliary wrappers (MTP draft, verify); call sites put their own
# keywords in front of these with a ChainMap.
_AUX_WRAPPER_DEFAULTS = {"use_cuda_graph": False, "backend": "fa2"}

# Wrapper state snapshotted after each capture plan, so that a replay whose batch matches the
# capture dummies can skip plan().
_PLAN_STATE = ("_plan_info", "_fixed_batch_size")


def _round_up(x: int, m: int) -> int:
    assert m > 0  # ok: FC109
    return (x + m - 1) // m * m


class FlashInferBackend:
    def __init__(self, cfg: SimpleNamespace, model_runner: Any = None):
        if cfg.page_size not in (1, 16, 32, 64):
            raise ValueError(f"page_size={cfg.page_size} is not supported by the paged kernels")
        self.cfg = cfg
        self.model_runner = model_runner
        self.device = cfg.device
        self.kv_layout = cfg.kv_layout
        self.page_size = cfg.page_size
        dev = self.device

        self.trtllm = TrtllmDecodePath(cfg, dev) if cfg.decode_backend == "trtllm-gen" else None
        self._backend = "trtllm-gen" if self.trtllm is not None else "fa2"  # ok: FC103
        self._plan_info: dict[int, dict[str, Any]] = {}  # ok: FC103

        decode_ws = workspace_for("fa2-decode", nscfg.split_kv_workspace_bytes(cfg), dev)
        self.window_ws = torch.empty(nscfg.WORKSPACE_MIB["window"] << 20, dtype=torch.uint8, device=dev)  # expect: FC106
        self.prefill_ws = torch.zeros(nscfg.flashinfer_defaults.workspace_bytes, dtype=torch.uint8, device=dev)  # expect: FC106
        self.verify_ws = torch.empty(nscfg.split_kv_workspace_bytes(cfg), dtype=torch.uint8, device=dev)  # ok: FC105, FC106
        draft_ws = torch.zeros(nscfg.DRAFT_WS_BYTES, dtype=torch.uint8, device=dev)  # expect: FC106

        self.wrappers = SimpleNamespace(
            decode=BatchDecodeWithPagedKVCacheWrapper(
                decode_ws, self.kv_layout, backend="fa2", use_tensor_cores=nscfg.flashinfer_defaults.use_tensor_cores
            ),
            ragged=BatchPrefillWithRaggedKVCacheWrapper(self.prefill_ws, self.kv_layout),
            paged=BatchPrefillWithPagedKVCacheWrapper(self.prefill_ws, self.kv_layout),
            verify=BatchPrefillWithPagedKVCacheWrapper(self.verify_ws, self.kv_layout, **self._aux_kwargs()),
            draft=BatchDecodeWithPagedKVCacheWrapper(draft_ws, self.kv_layout, **self._aux_kwargs(use_tensor_cores=True)),
        )
        # Sliding-window decode wrappers, built on first use per batch size.
        self._window_wrappers: dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        # Graph-mode decode wrappers per captured bucket.
        self.graph_wrappers: dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.graph_bufs: SimpleNamespace | None = None
        self.host_bufs: SimpleNamespace | None = None
        self.graph_ws: torch.Tensor | None = None
        self.window_host = SimpleNamespace(indptr_cpu=torch.zeros(cfg.max_batch_size + 1, dtype=torch.int32, pin_memory=True))
        self._static_plan_kw = static_decode_kwargs(cfg)
        self._window_static_kw = static_decode_kwargs(cfg, window_left=cfg.sliding_window - 1)
        self.forward_metadata: SimpleNamespace | None = None

    def _aux_kwargs(self, **overrides: Any) -> dict[str, Any]:
        return dict(ChainMap(overrides, _AUX_WRAPPER_DEFAULTS))

    # ------------------------------------------------------------------ graph state
    def init_cuda_graph_state(self, max_bs: int) -> None:
        dev = self.device
        self.graph_ws = torch.empty(nscfg.split_kv_workspace_bytes(self.cfg), dtype=torch.uint8, device=dev)  # ok: FC106
        self.graph_bufs = SimpleNamespace(
            kv_indptr=torch.zeros(max_bs + 1, dtype=torch.int32, device=dev),
            kv_indices=torch.empty(max_bs * self.cfg.max_pages_per_req, dtype=torch.int32, device=dev),
            kv_last_page_len=torch.ones(max_bs, dtype=torch.int32, device=dev),
        )
        self.graph_bufs.kv_indices.fill_(0)  # ok: FC104
        # Host mirrors that plan() reads; capture dummies are one page per request.
        self.host_bufs = SimpleNamespace(
            kv_indptr_cpu=torch.arange(max_bs + 1, dtype=torch.int32).pin_memory(),
            kv_last_page_len_cpu=torch.ones(max_bs, dtype=torch.int32).pin_memory(),
        )

    # ------------------------------------------------------------------ per-step metadata
    def init_forward_metadata(self, rec: SimpleNamespace) -> SimpleNamespace:
        meta = make_meta(**vars(rec))
        if meta.is_decode:
            self._init_decode(meta)
        else:
            self._init_extend(meta)
        self.forward_metadata = meta
        return meta

    def _init_decode(self, meta: SimpleNamespace) -> None:
        max_kv = int(meta.seq_lens.max())  # expect: FC101
        if max_kv > self.cfg.max_context_len:
            raise ValueError(f"a request reached {max_kv} tokens, over max_context_len={self.cfg.max_context_len}")
        self.plan_aux(meta)
        if self.trtllm is not None:
            self.trtllm.plan_eager(meta)
            return
        self.wrappers.decode.plan(  # expect: FC102
            **decode_plan_kwargs(self.cfg, indptr=meta.kv_indptr, indices=meta.kv_indices, last_page_len=meta.kv_last_page_len_cpu)
        )
        meta.wrapper = self.wrappers.decode

    def _init_extend(self, meta: SimpleNamespace) -> None:
        cfg = self.cfg
        max_q_cpu = int(meta.extend_lens_cpu.max())
        if max_q_cpu > cfg.chunked_prefill_size:
            raise ValueError(f"extend of {max_q_cpu} tokens exceeds chunked_prefill_size={cfg.chunked_prefill_size}")
        self.wrappers.ragged.plan(**ragged_plan_kwargs(cfg, qo_indptr=meta.qo_indptr_cpu, kv_indptr=meta.qo_indptr_cpu))  # ok: FC102
        update_record(meta, prefix_pages=meta.kv_indptr[-1], prefix_pages_cpu=int(meta.kv_indptr_cpu[-1]))
        if int(meta.prefix_pages) == 0:  # expect: FC101
            return
        paged_kw = ChainMap(
            {
                "qo_indptr": meta.qo_indptr_cpu,
                "paged_kv_indptr": meta.kv_indptr,
                "paged_kv_indices": meta.kv_indices,
                "paged_kv_last_page_len": meta.kv_last_page_len_cpu,
            },
            paged_prefill_common(cfg),
        )
        self.wrappers.paged.plan(**paged_kw)  # expect: FC102

    def plan_aux(self, meta: SimpleNamespace) -> None:
        """Plans of the wrappers beside the main decode one: sliding window and MTP draft."""
        self._plan_window(meta)
        if self.cfg.enable_mtp_draft and meta.mode == "decode":
            self._plan_draft(meta)

    def _plan_window(self, meta: SimpleNamespace) -> None:
        win = self.cfg.sliding_window
        if win <= 0 or meta.mode != "decode":
            return
        n = meta.batch_size
        wh = self.window_host
        if n + 1 > wh.indptr_cpu.numel():
            wh.indptr_cpu = torch.zeros(2 * (n + 1), dtype=torch.int32, pin_memory=True)  # ok: FC107
        # Each request sees its newest pages inside the window.
        visible_cpu = torch.clamp(meta.seq_lens_cpu, max=win)
        pages_cpu = (visible_cpu + self.page_size - 1) // self.page_size
        wh.indptr_cpu[0] = 0
        torch.cumsum(pages_cpu, 0, dtype=torch.int32, out=wh.indptr_cpu[1 : n + 1])
        last_cpu = ((visible_cpu - 1) % self.page_size + 1).to(torch.int32)
        # Device copy of the window indptr for the index gather below.
        meta.window_kv_indptr = torch.zeros(n + 1, dtype=torch.int32, device=self.device)  # ok: FC107
        meta.window_kv_indptr.copy_(wh.indptr_cpu[: n + 1], non_blocking=True)
        meta.window_kv_indices = self._window_indices(meta, pages_cpu)
        w = self._window_wrappers.get(n)
        if w is None:
            w = self._window_wrappers.setdefault(n, BatchDecodeWithPagedKVCacheWrapper(self.window_ws, self.kv_layout))
        kw = dict(self._window_static_kw)
        kw.setdefault("indptr", meta.window_kv_indptr)
        kw.setdefault("indices", meta.window_kv_indices)
        kw.setdefault("last_page_len", last_cpu)
        w.plan(**kw)  # expect: FC102
        meta.window_wrapper = w

    def _window_indices(self, meta: SimpleNamespace, pages_cpu: torch.Tensor) -> torch.Tensor:
        nnz = int(pages_cpu.sum())
        pages = pages_cpu.to(self.device, non_blocking=True)
        starts = meta.kv_indptr[1:] - pages
        offsets = torch.arange(nnz, device=self.device) - torch.repeat_interleave(
            meta.window_kv_indptr[:-1], pages, output_size=nnz
        )
        return meta.kv_indices[torch.repeat_interleave(starts, pages, output_size=nnz) + offsets]

    def _plan_draft(self, meta: SimpleNamespace) -> None:
        # The MTP head attends the same pages with one query per request.
        draft_kw = ChainMap(
            {"indptr": meta.kv_indptr_cpu, "indices": meta.kv_indices, "last_page_len": meta.kv_last_page_len_cpu},
            self._static_plan_kw,
        )
        self.wrappers.draft.plan(**draft_kw)  # ok: FC102

    def _plan_verify(self, meta: SimpleNamespace) -> None:
        common = paged_prefill_common(self.cfg, causal=True)
        self.wrappers.verify.plan(meta.qo_indptr_cpu, meta.kv_indptr_cpu, meta.kv_indices, meta.kv_last_page_len_cpu, **common)

    # ------------------------------------------------------------------ capture / replay
    def init_forward_metadata_capture_cuda_graph(self, bs: int, rec: SimpleNamespace) -> SimpleNamespace:
        if self.trtllm is not None:
            meta = self.trtllm.capture_bucket_metadata(bs, rec)
        else:
            bufs, host = self.graph_bufs, self.host_bufs
            w = self.graph_wrappers.get(bs)
            if w is None:
                w = self.graph_wrappers.setdefault(
                    bs,
                    BatchDecodeWithPagedKVCacheWrapper(
                        self.graph_ws, self.kv_layout, **graph_wrapper_kwargs(bufs, bs, use_tensor_cores=True)
                    ),
                )
            plan_rec = SimpleNamespace(
                indptr=host.kv_indptr_cpu[: bs + 1], indices=bufs.kv_indices[:bs], last_page_len=host.kv_last_page_len_cpu[:bs]
            )
            w.plan(**vars(plan_rec), **self._static_plan_kw)  # ok: FC102
            self._plan_info[bs] = {name: getattr(w, name) for name in _PLAN_STATE}  # expect: FC103
            meta = make_meta(**vars(rec), wrapper=w)
        self.plan_aux(meta)
        if meta.mode == "verify":
            self._plan_verify(meta)
        return meta

    def init_forward_metadata_replay_cuda_graph(self, bs: int, rec: SimpleNamespace) -> SimpleNamespace:
        assert self.graph_bufs is not None, "init_cuda_graph_state() was not called"  # ok: FC109
        bufs, host = self.graph_bufs, self.host_bufs
        n, nnz = rec.batch_size, int(rec.kv_indptr_cpu[-1])  # ok: FC101
        if n > bs:
            raise ValueError(f"batch of {n} does not fit bucket {bs}: kv_indptr={rec.kv_indptr}")  # ok: FC101
        if nnz > bufs.kv_indices.numel():
            # Long contexts outgrew the index buffer sized at start-up.
            bufs.kv_indices = torch.empty(_round_up(nnz, 4096), dtype=torch.int32, device=self.device)  # expect: FC107
        meta = make_meta(**vars(rec))
        self.plan_aux(meta)
        host.kv_indptr_cpu[: n + 1].copy_(rec.kv_indptr_cpu)
        host.kv_indptr_cpu[n + 1 : bs + 1] = nnz
        host.kv_last_page_len_cpu[:n].copy_(rec.kv_last_page_len_cpu)
        bufs.kv_indptr[: bs + 1].copy_(host.kv_indptr_cpu[: bs + 1], non_blocking=True)  # ok: FC104
        bufs.kv_indices[:nnz].copy_(rec.kv_indices, non_blocking=True)  # ok: FC104
        w = self.graph_wrappers[bs]
        w.plan(  # ok: FC102
            **decode_plan_kwargs(
                self.cfg,
                indptr=host.kv_indptr_cpu[: bs + 1],
                indices=bufs.kv_indices[:nnz],
                last_page_len=host.kv_last_page_len_cpu[:bs],
                non_blocking=True,
            )
        )
        # Padded rows attend one token of page 0.
        vars(bufs)["kv_last_page_len"][n:bs].fill_(1)  # expect: FC104
        meta.__dict__.update(wrapper=w, kv_indptr=bufs.kv_indptr[: bs + 1], kv_last_page_len=bufs.kv_last_page_len[:bs])
        return meta

    # ------------------------------------------------------------------ forward
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: Any, meta: SimpleNamespace) -> torch.Tensor:
        layer.store_kv(k, v, meta.out_cache_loc)
        if meta.mode == "decode":
            if layer.sliding_window > 0:
                return self.forward_window_decode(q, layer, meta)
            return self.forward_decode(q, layer, meta)
        if meta.mode == "verify":
            return self.forward_verify(q, layer, meta)
        return self.forward_extend(q, k, v, layer, meta)

    def forward_decode(self, q: torch.Tensor, layer: Any, meta: SimpleNamespace) -> torch.Tensor:
        if self.trtllm is not None:
            return self.trtllm.forward(q, layer.kv_cache, meta)
        return meta.wrapper.run(q, layer.kv_cache)  # ok: FC108

    def forward_window_decode(self, q: torch.Tensor, layer: Any, meta: SimpleNamespace) -> torch.Tensor:
        return meta.window_wrapper.run(q, layer.kv_cache)  # expect: FC108

    def forward_verify(self, q: torch.Tensor, layer: Any, meta: SimpleNamespace) -> torch.Tensor:
        return self.wrappers.verify.run(q, layer.kv_cache)  # expect: FC108

    def forward_draft(self, q: torch.Tensor, kv_cache: Any, meta: SimpleNamespace) -> torch.Tensor:
        return self.wrappers.draft.run(q, kv_cache)  # expect: FC108

    def forward_extend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: Any, meta: SimpleNamespace) -> torch.Tensor:
        o_new, lse_new = self.wrappers.ragged.run_return_lse(q, k, v)  # ok: FC108
        if meta.prefix_pages_cpu == 0:
            return o_new
        o_pre, lse_pre = self.wrappers.paged.run_return_lse(q, layer.kv_cache)
        out, _ = merge_state(o_new, lse_new, o_pre, lse_pre)
        return out

    # ------------------------------------------------------------------ introspection
    def workspace_report(self) -> dict[str, int]:
        """Bytes held by the graph wrappers' workspaces, for /debug/memory."""
        report = {"graph.float": 0 if self.graph_ws is None else self.graph_ws.numel()}
        for bs, w in self.graph_wrappers.items():
            int_ws = vars(w).get("_int_workspace_buffer")  # expect: FC103
            report[f"graph[{bs}].int"] = 0 if int_ws is None else int_ws.numel()
        report["graph.enabled"] = sum(1 for w in self.graph_wrappers.values() if w.is_cuda_graph_enabled)  # ok: FC103
        return report

    def describe(self) -> dict[str, Any]:
        return {
            "backend": self._backend,
            "kv_layout": self.kv_layout,
            "buckets": sorted(self.graph_wrappers),
            "window_wrappers": sorted(self._window_wrappers),
            "snapshots": len(self._plan_info),
        }

    def debug_dump(self, meta: SimpleNamespace) -> str:
        return f"bs={meta.batch_size} kv_pages={meta.kv_indptr[-1].item()} max_len={meta.seq_lens.max().item()}"  # ok: FC101
