"""FlashInfer attention backend: typed metadata dicts, layered plan()/constructor kwargs, graph-mode decode per bucket."""
from __future__ import annotations

import functools
import logging
import os
from collections import ChainMap
from typing import Dict, Optional, Unpack

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper, merge_state
from flashinfer import BatchPrefillWithRaggedKVCacheWrapper

from backends.trtllm_decode import TrtllmDecode
from tdengine.plan_types import (GRAPH_BATCH_SIZES, PAGE_SIZE, PLAN_DEFAULTS, WS_SIZES, _WS_BYTES, DecodeMeta, ForwardBatch, PlanKwargs,
                                 PrefillMeta, ServeConfig, merge_plan_kwargs, prefill_plan_kwargs, wrapper_kwargs)

logger = logging.getLogger(__name__)


def _pad_indptr(indptr: torch.Tensor, raw: int, bs: int) -> None:
    indptr[raw + 1 : bs + 1] = indptr[raw]


class FlashInferBackend:
    WINDOW_WS_BYTES = 128 << 20

    def __init__(self, cfg: ServeConfig, req_to_token: torch.Tensor):
        assert cfg.page_size == PAGE_SIZE, "the plan defaults bake in the pool's page size"  # expect: FC109
        self.cfg, self.req_to_token, dev = cfg, req_to_token, cfg.device
        self._kv_layout = "NHD"  # ok: FC103
        self.plan_kwargs = merge_plan_kwargs(PLAN_DEFAULTS, num_qo_heads=cfg.num_qo_heads,
                                             num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim)
        decode_ws = torch.zeros(cfg.decode_workspace_bytes, dtype=torch.uint8, device=dev)  # ok: FC106
        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(decode_ws, "NHD", **wrapper_kwargs("decode"))
        prefill_ws = torch.zeros(_WS_BYTES["prefill"], dtype=torch.uint8, device=dev)  # expect: FC106
        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(prefill_ws, "NHD", **wrapper_kwargs("prefill"))
        ragged_ws = torch.empty(cfg.max_num_tokens * cfg.num_qo_heads * 512, dtype=torch.uint8, device=dev)  # ok: FC105
        self.ragged_wrapper = BatchPrefillWithRaggedKVCacheWrapper(ragged_ws, "NHD", backend="fa2")
        window_ws = torch.zeros(self.WINDOW_WS_BYTES, dtype=torch.uint8, device=dev)  # expect: FC106
        self.window_wrapper = BatchDecodeWithPagedKVCacheWrapper(window_ws, "NHD", **wrapper_kwargs("window"))
        softcap_ws = torch.zeros(WS_SIZES["softcap"], dtype=torch.uint8, device=dev)  # expect: FC106
        softcap_kwargs = dict(wrapper_kwargs("softcap"))
        softcap_kwargs.setdefault("use_cuda_graph", False)
        self.softcap_wrapper = BatchDecodeWithPagedKVCacheWrapper(softcap_ws, "NHD", **softcap_kwargs)
        verify_ws = torch.zeros(int(os.getenv("TD_VERIFY_WS_MB", "64")) << 20, dtype=torch.uint8, device=dev)  # expect: FC106
        self.verify_wrapper = BatchPrefillWithPagedKVCacheWrapper(verify_ws, "NHD", **wrapper_kwargs("prefill"))
        self.trtllm = TrtllmDecode(cfg)
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.graph_meta: Dict[int, DecodeMeta] = {}
        self.graph_bufs: Dict[str, torch.Tensor] = {}
        self.host_bufs: Dict[str, torch.Tensor] = {}
        self.eager_bufs: Optional[Dict[str, torch.Tensor]] = None
        self.qo_buf: Optional[torch.Tensor] = None
        self.forward_meta: Optional[DecodeMeta | PrefillMeta] = None
        self._plan_info: Dict[int, int] = {}  # ok: FC103

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        self._check_batch(batch)
        if torch.unique(batch["req_pool_indices"]).numel() != batch["batch_size"]:  # expect: FC101
            raise ValueError(f"a request appears twice in the batch: {batch['req_pool_indices']}")  # ok: FC101
        if torch.nonzero(batch["seq_lens"] == 0).numel():  # expect: FC101
            raise ValueError("empty sequence in the batch")
        self.forward_meta = self._decode_meta(batch) if batch["mode"] == "decode" else self._prefill_meta(batch)

    def _check_batch(self, batch: ForwardBatch) -> None:
        assert batch["seq_lens_cpu"].numel() == batch["batch_size"], "stale host mirror"  # expect: FC109

    def _gather_pages(self, rows: torch.Tensor, pages_cpu: torch.Tensor, nnz: int) -> torch.Tensor:
        pages = pages_cpu.to(rows.device, non_blocking=True)
        owner = torch.repeat_interleave(torch.arange(rows.numel(), device=rows.device), pages, output_size=nnz)  # ok: FC101
        col = torch.arange(nnz, device=rows.device) - (torch.cumsum(pages, 0) - pages)[owner]
        return self.req_to_token[rows[owner], col].int()

    def _decode_meta(self, batch: ForwardBatch) -> DecodeMeta:
        bs, dev = batch["batch_size"], self.cfg.device
        if bs > max(GRAPH_BATCH_SIZES) and self.cfg.trtllm_direct_decode:  # ok: FC101
            tables = self.req_to_token[batch["req_pool_indices"]]
            return self.trtllm.prepare({"batch_size": bs, "seq_lens": batch["seq_lens"], "block_tables": tables})
        pages_cpu = ((batch["seq_lens"] + PAGE_SIZE - 1) // PAGE_SIZE).cpu()  # expect: FC101
        indptr_cpu = torch.zeros(bs + 1, dtype=torch.int32)
        torch.cumsum(pages_cpu, 0, dtype=torch.int32, out=indptr_cpu[1:])
        nnz = int(indptr_cpu[-1])  # ok: FC101
        if self.eager_bufs is None:
            self.eager_bufs = {"kv_indptr": torch.zeros(self.cfg.max_running_requests + 1, dtype=torch.int32, device=dev)}  # ok: FC107
        if bs + 1 > self.eager_bufs["kv_indptr"].numel():
            self.eager_bufs["kv_indptr"].resize_(bs + 1)  # expect: FC107
        self.eager_bufs["kv_indptr"][: bs + 1].copy_(indptr_cpu, non_blocking=True)
        meta: DecodeMeta = {"batch_size": bs, "seq_lens": batch["seq_lens"], "kv_indptr_cpu": indptr_cpu,
                            "kv_indptr": self.eager_bufs["kv_indptr"][: bs + 1], "wrapper": self.decode_wrapper,
                            "kv_last_page_len_cpu": (batch["seq_lens_cpu"] - 1) % PAGE_SIZE + 1}
        meta["kv_indices"] = torch.empty(nnz, dtype=torch.int32, device=dev)  # ok: FC107
        meta["kv_indices"].copy_(self._gather_pages(batch["req_pool_indices"], pages_cpu, nnz))
        self.decode_wrapper.plan(**(self.plan_kwargs | {"indptr": indptr_cpu, "indices": meta["kv_indices"],  # ok: FC102
                                                       "last_page_len": meta["kv_last_page_len_cpu"]}))
        if self.cfg.window_layers and max(batch["seq_lens"]) > self.cfg.sliding_window:  # expect: FC101
            window = self.plan_kwargs | {"window_left": self.cfg.sliding_window}
            self.window_wrapper.plan(**(window | {"indptr": meta["kv_indptr"], "indices": meta["kv_indices"],  # expect: FC102
                                                 "last_page_len": meta["kv_last_page_len_cpu"]}))
        self.eager_bufs["kv_indptr"][bs + 1 :].zero_()  # ok: FC104
        if self.cfg.softcap_layers:
            meta["softcap_wrapper"] = self.softcap_wrapper
            self._plan_softcap(meta)
        return meta

    def _plan_softcap(self, meta: DecodeMeta) -> None:
        kwargs = dict(ChainMap({"logits_soft_cap": self.cfg.logits_soft_cap}, self.plan_kwargs))
        kwargs.setdefault("last_page_len", meta.get("kv_last_page_len", meta["kv_last_page_len_cpu"]))
        self.softcap_wrapper.plan(meta["kv_indptr_cpu"], meta["kv_indices"], **kwargs)  # expect: FC102

    def _prefill_meta(self, batch: ForwardBatch) -> PrefillMeta:
        bs, dev = batch["batch_size"], self.cfg.device
        if batch["extend_prefix_lens"].any():  # expect: FC101
            logger.debug("extend with cached prefixes: %s", batch["extend_prefix_lens"])  # ok: FC101
        use_ragged = not batch["extend_prefix_lens_cpu"].any()  # ok: FC101
        num_tokens = int(batch["extend_seq_lens"].sum())  # expect: FC101
        if self.qo_buf is None or self.qo_buf.numel() < bs + 1:
            self.qo_buf = torch.zeros(self.cfg.max_running_requests + 1, dtype=torch.int32, device=dev)  # expect: FC107
        qo_cpu = torch.zeros(bs + 1, dtype=torch.int32)
        qo_cpu[1:] = torch.cumsum(batch["seq_lens_cpu"] - batch["extend_prefix_lens_cpu"], 0)
        self.qo_buf[: bs + 1].copy_(qo_cpu, non_blocking=True)
        pages_cpu = (batch["seq_lens_cpu"] + PAGE_SIZE - 1) // PAGE_SIZE
        kv_cpu = torch.zeros(bs + 1, dtype=torch.int32)
        kv_cpu[1:] = torch.cumsum(pages_cpu, 0)
        meta: PrefillMeta = {"num_tokens": num_tokens, "qo_indptr": self.qo_buf[: bs + 1], "qo_indptr_cpu": qo_cpu,
                             "kv_indptr_cpu": kv_cpu, "use_ragged": use_ragged, "wrapper": self.prefill_wrapper,
                             "kv_indices": self._gather_pages(batch["req_pool_indices"], pages_cpu, int(kv_cpu[-1])),
                             "kv_last_page_len_cpu": (batch["seq_lens_cpu"] - 1) % PAGE_SIZE + 1}
        if use_ragged:
            self.ragged_wrapper.plan(qo_cpu, qo_cpu, causal=True, **prefill_plan_kwargs(self.plan_kwargs, paged=False))  # ok: FC102
        else:
            self.plan_extend(self.prefill_wrapper, meta, causal=True, **prefill_plan_kwargs(self.plan_kwargs, paged=True))
        return meta

    def plan_extend(self, w: BatchPrefillWithPagedKVCacheWrapper, meta: PrefillMeta, causal: bool,
                    **kwargs: Unpack[PlanKwargs]) -> None:
        w.plan(meta["qo_indptr"], meta["kv_indptr_cpu"], meta["kv_indices"], meta["kv_last_page_len_cpu"],  # expect: FC102
               causal=causal, **kwargs)

    def init_cuda_graph_state(self, max_bs: int) -> None:
        dev, i32 = self.cfg.device, torch.int32
        self.graph_bufs = {"kv_indptr": torch.zeros(max_bs + 1, dtype=i32, device=dev),
                           "kv_indices": torch.zeros(max_bs * self.cfg.max_context_len // PAGE_SIZE, dtype=i32, device=dev),
                           "kv_last_page_len": torch.ones(max_bs, dtype=i32, device=dev)}
        self.host_bufs = {k: torch.zeros_like(v, device="cpu").pin_memory() for k, v in self.graph_bufs.items()}
        self.graph_ws = torch.empty(max_bs * self.cfg.num_qo_heads * self.cfg.head_dim * 4096, dtype=torch.uint8, device=dev)  # expect: FC105
        self.graph_bufs["kv_last_page_len"].fill_(1)  # ok: FC104

    def init_forward_metadata_capture_cuda_graph(self, bs: int, seq_lens: torch.Tensor, mode: str) -> None:
        bufs, host = self.graph_bufs, self.host_bufs
        host["kv_last_page_len"][:bs] = (seq_lens.cpu() - 1) % PAGE_SIZE + 1  # expect: FC101
        host["kv_indptr"][: bs + 1] = torch.arange(bs + 1, dtype=torch.int32)
        bufs["kv_indptr"][: bs + 1].copy_(host["kv_indptr"][: bs + 1])  # ok: FC104
        if bs not in self.graph_wrappers:  # the verify graphs of a bucket reuse its decode wrapper
            extra = {"use_cuda_graph": True, "paged_kv_indptr_buffer": bufs["kv_indptr"][: bs + 1],
                     "paged_kv_indices_buffer": bufs["kv_indices"], "paged_kv_last_page_len_buffer": bufs["kv_last_page_len"][:bs]}
            w = BatchDecodeWithPagedKVCacheWrapper(self.graph_ws, self._kv_layout, **wrapper_kwargs("decode", **extra))
            self.graph_wrappers[bs] = w
            self.graph_meta[bs] = {"batch_size": bs, "seq_lens": seq_lens, "kv_indptr": bufs["kv_indptr"][: bs + 1],
                                   "kv_indices": bufs["kv_indices"], "kv_last_page_len": bufs["kv_last_page_len"][:bs],
                                   "kv_indptr_cpu": host["kv_indptr"][: bs + 1], "wrapper": w,
                                   "kv_last_page_len_cpu": host["kv_last_page_len"][:bs]}
        meta = self.graph_meta[bs]
        meta.setdefault("softcap_wrapper", self.softcap_wrapper)
        plan = functools.partial(meta["wrapper"].plan, **self.plan_kwargs)
        plan(meta["kv_indptr"], meta["kv_indices"][:bs], meta["kv_last_page_len"])  # expect: FC102
        self.forward_meta = self._plan_verify(bs, bufs["kv_indptr"][: bs + 1]) if mode == "verify" else meta

    def _plan_verify(self, bs: int, kv_indptr: torch.Tensor) -> PrefillMeta:
        """Target verify: draft tokens attend causally to each other (ragged) and fully to the prefix (paged)."""
        qo_cpu, nnz = torch.arange(bs + 1, dtype=torch.int32) * self.cfg.num_draft_tokens, int(kv_indptr[bs])  # expect: FC101
        self.ragged_wrapper.plan(qo_cpu, qo_cpu, causal=True, **prefill_plan_kwargs(self.plan_kwargs, paged=False))  # ok: FC102
        self.verify_wrapper.plan(**dict(qo_indptr=qo_cpu, paged_kv_indptr=kv_indptr, paged_kv_indices=self.graph_bufs["kv_indices"][:nnz],  # expect: FC102
                                        paged_kv_last_page_len=self.host_bufs["kv_last_page_len"][:bs],
                                        **prefill_plan_kwargs(self.plan_kwargs, paged=True)))
        return {"num_tokens": int(qo_cpu[-1]), "qo_indptr_cpu": qo_cpu, "use_ragged": False, "wrapper": self.verify_wrapper}

    def init_forward_metadata_replay_cuda_graph(self, bs: int, batch: ForwardBatch) -> None:
        raw = batch["batch_size"]
        assert raw <= bs, f"a batch of {raw} does not fit the bucket-{bs} graph"  # expect: FC109
        if batch["seq_lens_cpu"].min().item() <= 0:  # ok: FC101
            raise ValueError("empty sequence in a graphed batch")
        bufs, host, meta = self.graph_bufs, self.host_bufs, self.graph_meta[bs]
        pages_cpu = (batch["seq_lens_cpu"] + PAGE_SIZE - 1) // PAGE_SIZE
        torch.cumsum(pages_cpu, 0, dtype=torch.int32, out=host["kv_indptr"][1 : raw + 1])  # ok: FC104
        host["kv_indptr"][raw + 1 : bs + 1] = host["kv_indptr"][raw]
        host["kv_last_page_len"][:raw].copy_((batch["seq_lens"] - 1) % PAGE_SIZE + 1)  # expect: FC101
        host["kv_last_page_len"][raw:bs] = 1
        nnz = int(host["kv_indptr"][raw])  # ok: FC101
        if raw < bs:
            logger.debug(f"padding a batch of {raw} to the bucket-{bs} graph; seq_lens={batch['seq_lens']}")  # expect: FC101
        if nnz > host["kv_indices"].numel():
            host["kv_indices"] = torch.empty(2 * nnz, dtype=torch.int32, pin_memory=True)  # ok: FC107
        if nnz > bufs["kv_indices"].numel():
            self.graph_bufs["kv_indices"] = torch.empty(2 * nnz, dtype=torch.int32, device=self.cfg.device)  # expect: FC107
        if nnz * self.cfg.num_qo_heads * 64 > self.graph_ws.numel():  # split-k scratch grows with the pages
            self.graph_ws = torch.zeros(2 * self.graph_ws.numel(), dtype=torch.uint8, device=self.cfg.device)  # expect: FC107
        bufs["kv_indices"][:nnz].copy_(self._gather_pages(batch["req_pool_indices"], pages_cpu, nnz))  # ok: FC104
        meta["wrapper"].plan(**(self.plan_kwargs | {"indptr": host["kv_indptr"][: bs + 1], "indices": bufs["kv_indices"][:nnz],  # ok: FC102
                                                    "last_page_len": host["kv_last_page_len"][:bs]}))
        if self.cfg.window_layers:
            window = {"indptr": host["kv_indptr"][: bs + 1], "indices": bufs["kv_indices"][:nnz], "last_page_len": host["kv_last_page_len"][:bs]}
            self.window_wrapper.plan(**ChainMap(window, {"window_left": self.cfg.sliding_window}, self.plan_kwargs))  # ok: FC102
        if self.cfg.softcap_layers:
            self._plan_softcap(meta)
        self._plan_info[bs] = batch["seq_lens"].sum().item()  # expect: FC101
        self.forward_meta = self._plan_verify(bs, host["kv_indptr"][: bs + 1]) if batch["mode"] == "verify" else meta
        _pad_indptr(bufs["kv_indptr"], raw, bs)  # expect: FC104
        bufs["kv_last_page_len"][raw:bs].fill_(1)  # expect: FC104
        meta["seq_lens"][:raw].copy_(batch["seq_lens"])  # ok: FC104

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, layer_id: int, meta: DecodeMeta) -> torch.Tensor:
        if "block_tables" in meta:
            return self.trtllm.decode(q, kv_cache, meta)
        if layer_id in self.cfg.softcap_layers:
            return meta["softcap_wrapper"].run(q, kv_cache)  # expect: FC108
        if layer_id in self.cfg.window_layers:
            return self.window_wrapper.run(q, kv_cache)  # expect: FC108
        return meta["wrapper"].run(q, kv_cache)  # ok: FC108

    def forward_verify(self, q, k, v, kv_cache: torch.Tensor, meta: PrefillMeta) -> torch.Tensor:
        o_new, lse_new = self.ragged_wrapper.run_return_lse(q, k, v)  # expect: FC108
        o_old, lse_old = meta["wrapper"].run_return_lse(q, kv_cache)  # expect: FC108
        return merge_state(o_new, lse_new, o_old, lse_old)[0]

    def forward_extend(self, q, k, v, kv_cache: torch.Tensor, meta: PrefillMeta) -> torch.Tensor:
        if meta["use_ragged"]:  # ok: FC101
            return self.ragged_wrapper.run(q, k, v)  # ok: FC108
        return meta["wrapper"].run(q, kv_cache)  # ok: FC108

    def warmup(self) -> None:
        """JIT the eager decode kernels once before serving (dummy batch of one page per request)."""
        n, dev = 8, self.cfg.device
        self.decode_wrapper.plan(**{"indptr": torch.arange(n + 1, dtype=torch.int32, device=dev),  # expect: FC102
                                    "indices": torch.arange(n, dtype=torch.int32, device=dev),
                                    "last_page_len": torch.ones(n, dtype=torch.int32)}, **self.plan_kwargs)
        qo_cpu, last_cpu = torch.arange(n + 1, dtype=torch.int32), torch.ones(n, dtype=torch.int32)
        self.prefill_wrapper.plan(qo_cpu, qo_cpu, torch.arange(n, dtype=torch.int32, device=dev), last_cpu,  # ok: FC102
                                  **prefill_plan_kwargs(self.plan_kwargs, paged=True))
        q = torch.zeros(n, self.cfg.num_qo_heads, self.cfg.head_dim, dtype=torch.bfloat16, device=dev)
        kv = torch.zeros(n, 2, PAGE_SIZE, self.cfg.num_kv_heads, self.cfg.head_dim, dtype=torch.bfloat16, device=dev)
        self.decode_wrapper.run(q, kv)  # ok: FC108

    def reset_graph_state(self) -> None:
        """After an OOM retraction: forget every cached page table so stale pages are never read."""
        assert self.graph_bufs, "init_cuda_graph_state() has not run"  # ok: FC109
        for buf in self.graph_bufs.values():
            buf.zero_()  # expect: FC104

    def plan_state_snapshot(self) -> Dict[str, object]:
        """Per-bucket planner state for the /debug endpoint."""
        assert len(self.graph_meta) == len(self.graph_wrappers), "a bucket lost its metadata"  # ok: FC109
        state: Dict[str, object] = {"tokens_per_bucket": dict(self._plan_info), "layout": getattr(self, "_kv_layout")}  # ok: FC103
        for bs, w in self.graph_wrappers.items():
            state[f"bs{bs}"] = {name: getattr(w, name, None) for name in ("_plan_info", "_cached_module")}  # expect: FC103
            state[f"bs{bs}_int_ws"] = w._int_workspace_buffer.numel()  # expect: FC103
            state[f"bs{bs}_graph"] = w.is_cuda_graph_enabled  # ok: FC103
        state["eager_plan"] = vars(self.decode_wrapper).get("_plan_info")  # expect: FC103
        return state
