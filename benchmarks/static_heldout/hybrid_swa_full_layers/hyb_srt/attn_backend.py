"""Two sets of FlashInfer wrappers: sliding-window layers and full layers, eager and per graph bucket."""

from __future__ import annotations

import functools
import math
from typing import Dict, List, Sequence

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from swahybrid.compat import EXPECTED_LAYOUT, INDICES_BUF_FIELD
from swahybrid.config import HybridConfig, LayerKind
from swahybrid.metadata import ForwardBatch, HybridMetadataBuilder
from swahybrid.pools import NULL_PAGE, TwoPools


class HybridAttnBackend:
    PREFILL_WS_BYTES = 512 * 1024 * 1024

    def __init__(self, cfg: HybridConfig, pools: TwoPools, device: torch.device) -> None:
        self.cfg = cfg
        self.pools = pools
        self.device = device
        self.page_size = cfg.page_size
        self.heads = (cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim, cfg.page_size)
        self.sm_scale = cfg.head_dim**-0.5
        layout = pools.full._kv_layout  # ok: FC103
        if layout != EXPECTED_LAYOUT:
            raise ValueError(f"pool layout {layout}, the kernels are built for {EXPECTED_LAYOUT}")

        self.swa_ws = torch.empty(cfg.decode_workspace_bytes(LayerKind.SWA), dtype=torch.uint8, device=device)  # ok: FC105
        self.full_ws = torch.empty(cfg.decode_workspace_bytes(LayerKind.FULL), dtype=torch.uint8, device=device)
        self.prefill_ws = torch.empty(self.PREFILL_WS_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.full_trt_ws = torch.empty(cfg.trtllm_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
        self.full_trt_ws.zero_()

        self.eager = {
            "swa": BatchDecodeWithPagedKVCacheWrapper(self.swa_ws, layout, use_tensor_cores=True),
            "full": BatchDecodeWithPagedKVCacheWrapper(self.full_ws, layout, use_tensor_cores=True),
        }
        hq, hkv, d, ps = self.heads
        self._full_plan = functools.partial(
            self.eager["full"].plan, num_qo_heads=hq, num_kv_heads=hkv, head_dim=d, page_size=ps, data_type=torch.bfloat16
        )
        # prefill and decode steps alternate, so the SWA prefill shares the SWA decode workspace
        self.prefill = {
            "swa": BatchPrefillWithPagedKVCacheWrapper(self.swa_ws, layout),
            "full": BatchPrefillWithPagedKVCacheWrapper(self.prefill_ws, layout),
        }

        gb = cfg.max_graph_bs
        self.swa_kv_indptr = torch.zeros(gb + 1, dtype=torch.int32, device=device)
        self.swa_kv_indices = torch.zeros(gb * cfg.swa_pages_per_req, dtype=torch.int32, device=device)
        self.swa_last_page = torch.ones(gb, dtype=torch.int32, device=device)
        self.full_kv_indptr = torch.zeros(gb + 1, dtype=torch.int32, device=device)
        self.full_kv_indices = torch.zeros(cfg.full_pool_pages, dtype=torch.int32, device=device)
        self.full_last_page = torch.ones(gb, dtype=torch.int32, device=device)
        self.swa_indptr_cpu = torch.zeros(gb + 1, dtype=torch.int32, pin_memory=True)
        self.swa_last_cpu = torch.ones(gb, dtype=torch.int32, pin_memory=True)
        self.full_indptr_cpu = torch.zeros(gb + 1, dtype=torch.int32, pin_memory=True)
        self.full_last_cpu = torch.ones(gb, dtype=torch.int32, pin_memory=True)
        self.graph_ws = {
            kind.value: torch.empty(cfg.graph_workspace_bytes(kind), dtype=torch.uint8, device=device)
            for kind in LayerKind
        }
        self.graph: Dict[int, Dict[str, BatchDecodeWithPagedKVCacheWrapper]] = {}
        self.layout = layout
        self.builder = HybridMetadataBuilder(cfg, pools, device)
        self.check_layouts()

    def check_layouts(self) -> None:
        for kind, w in self.eager.items():
            if w._kv_layout != self.layout:  # expect: FC103
                raise RuntimeError(f"eager {kind} wrapper was built for another KV layout")

    def bound_indices(self, kind: str) -> torch.Tensor:
        return self.swa_kv_indices if kind == "swa" else self.full_kv_indices

    # ------------------------------------------------------------------ eager steps

    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        md = self.builder.build(fb)
        fb.metadata = md
        hq, hkv, d, ps = self.heads
        if fb.is_decode:  # ok: FC101
            self.eager["swa"].plan(  # expect: FC102
                md.swa_kv_indptr,
                md.swa_kv_indices,
                md.swa_last_page_cpu,
                hq,
                hkv,
                d,
                ps,
                window_left=self.cfg.window - 1,
                data_type=torch.bfloat16,
            )
            fb.use_trtllm_full = md.max_seq_len > self.cfg.trtllm_full_threshold
            if not fb.use_trtllm_full:
                self._full_plan(md.full_kv_indptr_cpu, md.full_kv_indices, md.full_last_page_len)  # expect: FC102
            fb.swa_wrapper = self.eager["swa"]
            fb.full_wrapper = self.eager["full"]
            return
        qo = fb.qo_indptr_cpu
        self.prefill["swa"].plan(
            qo, md.swa_kv_indptr_cpu, md.swa_kv_indices, md.swa_last_page_cpu, hq, hkv, d, ps,
            causal=True, window_left=self.cfg.window - 1, q_data_type=torch.bfloat16,
        )
        self.prefill["full"].plan(
            qo, md.full_kv_indptr_cpu, md.full_kv_indices, md.full_last_page_cpu, hq, hkv, d, ps,
            causal=True, q_data_type=torch.bfloat16,
        )

    # ------------------------------------------------------------------ graphs

    def _bind_bucket(self, bs: int) -> Dict[str, BatchDecodeWithPagedKVCacheWrapper]:
        self.swa_last_page[:bs].fill_(1)  # ok: FC104
        pair = {
            "swa": BatchDecodeWithPagedKVCacheWrapper(
                self.graph_ws["swa"],
                self.layout,
                use_cuda_graph=True,
                use_tensor_cores=True,
                paged_kv_indptr_buffer=self.swa_kv_indptr[: bs + 1],
                paged_kv_indices_buffer=self.swa_kv_indices,
                paged_kv_last_page_len_buffer=self.swa_last_page[:bs],
            ),
            "full": BatchDecodeWithPagedKVCacheWrapper(
                self.graph_ws["full"],
                self.layout,
                use_cuda_graph=True,
                use_tensor_cores=True,
                paged_kv_indptr_buffer=self.full_kv_indptr[: bs + 1],
                paged_kv_indices_buffer=self.full_kv_indices,
                paged_kv_last_page_len_buffer=self.full_last_page[:bs],
            ),
        }
        self.graph[bs] = pair
        return pair

    def _fill_mirror(self, indptr_cpu, last_cpu, lists: Sequence[List[int]], seq_np, bs: int) -> torch.Tensor:
        n = len(lists)
        ip = indptr_cpu.numpy()
        ip[0] = 0
        np.cumsum([len(p) for p in lists], out=ip[1 : n + 1])
        ip[n + 1 : bs + 1] = ip[n]
        last = last_cpu.numpy()
        last[:n] = (seq_np[:n] - 1) % self.page_size + 1
        last[n:bs] = 1
        flat = np.concatenate([np.asarray(p, np.int32) for p in lists]) if n else np.zeros(0, np.int32)
        return torch.from_numpy(flat).pin_memory()

    def _plan_bucket(self, bs: int, nnz_swa: int, nnz_full: int) -> None:
        hq, hkv, d, ps = self.heads
        pair = self.graph[bs]
        pair["swa"].plan(  # ok: FC102
            self.swa_indptr_cpu[: bs + 1],
            self.swa_kv_indices[:nnz_swa],
            self.swa_last_cpu[:bs],
            hq,
            hkv,
            d,
            ps,
            window_left=self.cfg.window - 1,
            data_type=torch.bfloat16,
        )
        pair["full"].plan(  # ok: FC102
            self.full_indptr_cpu[: bs + 1],
            self.full_kv_indices[:nnz_full],
            self.full_last_cpu[:bs],
            hq,
            hkv,
            d,
            ps,
            data_type=torch.bfloat16,
        )

    def init_forward_metadata_capture_cuda_graph(self, bs: int, fb: ForwardBatch) -> None:
        pair = self._bind_bucket(bs)
        for kind, w in pair.items():
            if getattr(w, INDICES_BUF_FIELD) is not self.bound_indices(kind):  # expect: FC103
                raise RuntimeError(f"{kind} graph wrapper of bs={bs} is not bound to the shared indices")
        seq_np = fb.seq_lens_cpu.numpy()
        dummy = [[NULL_PAGE] for _ in range(bs)]
        swa_flat = self._fill_mirror(self.swa_indptr_cpu, self.swa_last_cpu, dummy, seq_np, bs)
        full_flat = self._fill_mirror(self.full_indptr_cpu, self.full_last_cpu, dummy, seq_np, bs)
        self._plan_bucket(bs, swa_flat.numel(), full_flat.numel())
        fb.use_trtllm_full = False
        fb.swa_wrapper = pair["swa"]
        fb.full_wrapper = self.eager["full"]

    def init_forward_metadata_replay_cuda_graph(self, bs: int, fb: ForwardBatch) -> None:
        window_pages = math.ceil(fb.seq_lens.max() / self.page_size)  # expect: FC101
        keep = min(window_pages, self.cfg.swa_pages_per_req)
        self.builder.retire_left_window(fb)
        seq_np = fb.seq_lens_cpu.numpy()
        swa_lists = self.pools.swa.window_pages(fb.rids, keep)
        full_lists = [self.pools.full.pages_of(r) for r in fb.rids]
        swa_flat = self._fill_mirror(self.swa_indptr_cpu, self.swa_last_cpu, swa_lists, seq_np, bs)
        full_flat = self._fill_mirror(self.full_indptr_cpu, self.full_last_cpu, full_lists, seq_np, bs)
        self.full_kv_indices[: full_flat.numel()].copy_(full_flat, non_blocking=True)  # ok: FC104
        self.swa_kv_indices[: swa_flat.numel()].copy_(swa_flat, non_blocking=True)
        self._plan_bucket(bs, swa_flat.numel(), full_flat.numel())
        self.swa_last_page[:bs].clamp_(min=1)  # expect: FC104
        self.full_indptr_cpu[bs + 1 :].fill_(0)  # ok: FC104

    # ------------------------------------------------------------------ forward

    def _full_trtllm(self, q: torch.Tensor, cache: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        md = fb.metadata
        return trtllm_batch_decode_with_kv_cache(
            query=q,
            kv_cache=cache,
            workspace_buffer=self.full_trt_ws,
            block_tables=md.block_tables,
            seq_lens=fb.seq_lens,
            max_seq_len=md.max_seq_len,
            bmm1_scale=self.sm_scale,
            bmm2_scale=1.0,
        )

    def forward_decode(self, q: torch.Tensor, layer_id: int, fb: ForwardBatch) -> torch.Tensor:
        kind, cache = self.pools.kv(layer_id)
        if kind is LayerKind.SWA:
            return fb.swa_wrapper.run(q, cache)  # ok: FC108
        if fb.use_trtllm_full:
            return self._full_trtllm(q, cache, fb)
        return fb.full_wrapper.run(q, cache)  # expect: FC108

    def forward_extend(self, q: torch.Tensor, layer_id: int, fb: ForwardBatch) -> torch.Tensor:
        kind, cache = self.pools.kv(layer_id)
        return self.prefill[kind.value].run(q, cache)
