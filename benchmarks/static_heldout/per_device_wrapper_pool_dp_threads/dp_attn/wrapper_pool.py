"""Per-device FlashInfer wrappers, workspaces and graph buffers, in dicts keyed by the GPU index."""

import functools
import os
from typing import Dict, List, Tuple

import torch
from flashinfer import (BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper,
                        BatchPrefillWithRaggedKVCacheWrapper, merge_state)
from flashinfer.decode import fast_decode_plan

from dpserve import (PAGE_SIZE, SWA_WINDOW, TC_GRAPH_WORKSPACE_BYTES, DeviceBatch, DPConfig, decode_workspace_bytes,
                     last_page_lens)

_BOUND_BUFFER_FIELDS = ("_paged_kv_indptr_buf", "_paged_kv_indices_buf", "_paged_kv_last_page_len_buf")

def prefix_workspace_bytes() -> int:
    return 64 << 20  # the shared system prompt is a few thousand tokens at most

def device_workspace(dev: int, nbytes: int, zero_init: bool = False) -> torch.Tensor:
    with torch.cuda.device(dev):
        ws = torch.empty(nbytes, dtype=torch.uint8, device="cuda")  # ok: FC105
        if zero_init:
            ws.zero_()
    return ws

@functools.lru_cache(maxsize=None)
def context_workspace(dev: int, nbytes: int) -> torch.Tensor:  # trtllm context attention of very long prompts
    with torch.cuda.device(dev):
        return torch.empty(nbytes, dtype=torch.uint8, device="cuda")  # expect: FC105

class WrapperPool:
    RAGGED_WORKSPACE_BYTES = 128 * 1024 * 1024

    def __init__(self, cfg: DPConfig):
        self.cfg = cfg
        self.devices: Tuple[int, ...] = tuple(cfg.device_ids)
        self._kv_layout, self._sm_scale = "HND", cfg.head_dim**-0.5
        self._fast_plan = fast_decode_plan
        self._plan_info, self.route = {}, {}
        self.prefix_pages: Dict[int, List[int]] = {d: [] for d in self.devices}
        self.prefix_indices: Dict[int, torch.Tensor] = {}
        self.graph_wrappers: Dict[Tuple[int, int], BatchDecodeWithPagedKVCacheWrapper] = {}
        max_bs, i32, u8 = cfg.max_bucket, torch.int32, torch.uint8
        self.kv_indptr_buf = {d: torch.zeros(max_bs + 1, dtype=i32, device=torch.device("cuda", d)) for d in self.devices}
        self.kv_indices_buf = {d: torch.zeros(cfg.max_pages_per_device, dtype=i32, device=torch.device("cuda", d)) for d in self.devices}
        self.last_page_buf = {d: torch.ones(max_bs, dtype=i32, device=torch.device("cuda", d)) for d in self.devices}
        self.seq_lens_buf = {d: torch.zeros(max_bs, dtype=i32, device=torch.device("cuda", d)) for d in self.devices}
        self.indptr_host = {d: torch.zeros(max_bs + 1, dtype=i32, pin_memory=True) for d in self.devices}
        self.last_page_host = {d: torch.ones(max_bs, dtype=i32, pin_memory=True) for d in self.devices}
        self._ws: Dict[int, torch.Tensor] = {}
        self.graph_workspace: Dict[int, torch.Tensor] = {}
        self.tc_graph_workspace: Dict[int, torch.Tensor] = {}
        self.wrappers: Dict[int, Dict[str, object]] = {}
        for d in self.devices:
            with torch.cuda.device(d):
                self._ws[d] = torch.empty(decode_workspace_bytes(cfg), dtype=u8, device="cuda")  # ok: FC105
                tc_ws = torch.empty_like(self._ws[d])  # ok: FC105
                prefill_workspace = torch.empty(cfg.prefill_workspace_bytes, dtype=u8, device="cuda")  # ok: FC106
                ragged_workspace = torch.empty(self.RAGGED_WORKSPACE_BYTES, dtype=u8, device="cuda")  # expect: FC106
                self.graph_workspace[d] = torch.empty(int(os.environ.get("DP_GRAPH_WS_MB", "256")) << 20, dtype=u8, device="cuda")  # expect: FC106
                self.tc_graph_workspace[d] = torch.zeros(TC_GRAPH_WORKSPACE_BYTES, dtype=u8, device="cuda")  # expect: FC106
                trtllm_workspace = torch.empty(decode_workspace_bytes(cfg), dtype=u8, device="cuda")  # expect: FC105
                prefix_workspace = torch.zeros(prefix_workspace_bytes(), dtype=u8, device="cuda")  # expect: FC106
            # trtllm-gen keeps split-k semaphores in the window workspace
            swa_workspace = device_workspace(d, decode_workspace_bytes(cfg), zero_init=True)
            self.wrappers[d] = {
                "decode": BatchDecodeWithPagedKVCacheWrapper(self._ws[d], self._kv_layout),  # ok: FC103
                "decode_tc": BatchDecodeWithPagedKVCacheWrapper(tc_ws, "HND", use_tensor_cores=True),
                "swa": BatchDecodeWithPagedKVCacheWrapper(swa_workspace, "HND", backend="trtllm-gen"),
                "overflow": BatchDecodeWithPagedKVCacheWrapper(trtllm_workspace, "HND", backend="trtllm-gen"),
                "prefill": BatchPrefillWithPagedKVCacheWrapper(prefill_workspace, "HND", backend="fa3"),
                "ragged": BatchPrefillWithRaggedKVCacheWrapper(ragged_workspace, "HND"),
                "prefix": BatchPrefillWithPagedKVCacheWrapper(prefix_workspace, "HND"),
            }

    def init_graph_wrappers(self) -> None:
        for d in self.devices:
            self.last_page_buf[d].fill_(1)  # ok: FC104
            with torch.cuda.device(d):
                for bs in self.cfg.graph_buckets:
                    tc = bs >= self.cfg.tensor_core_min_bucket
                    self.graph_wrappers[(d, bs)] = BatchDecodeWithPagedKVCacheWrapper(
                        self.tc_graph_workspace[d] if tc else self.graph_workspace[d], self._kv_layout,
                        use_cuda_graph=True, use_tensor_cores=tc, paged_kv_indptr_buffer=self.kv_indptr_buf[d][: bs + 1],
                        paged_kv_indices_buffer=self.kv_indices_buf[d], paged_kv_last_page_len_buffer=self.last_page_buf[d][:bs])

    def warm_up_kernels(self) -> None:
        cfg = self.cfg
        assert self.wrappers, "no devices"  # ok: FC109
        for dev in self.devices:
            indptr, last = torch.tensor([0, 1], dtype=torch.int32), torch.ones(1, dtype=torch.int32)
            with torch.cuda.device(dev):
                indices = torch.zeros(1, dtype=torch.int32, device="cuda")
                self.wrappers[dev]["decode"].plan(**dict(  # ok: FC102
                    indptr=indptr, indices=indices, last_page_len=last, num_qo_heads=cfg.num_qo_heads,
                    num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim, page_size=PAGE_SIZE))
                self.wrappers[dev]["prefill"].plan(torch.arange(2, dtype=torch.int32), indptr, indices, last,  # ok: FC102
                                                   *cfg.plan_dims, causal=True)
                # trtllm-gen reads the last-page lengths on the device
                self.wrappers[dev]["swa"].plan(indptr, indices, last.cuda(), *cfg.plan_dims)  # expect: FC102
            for name, w in self.wrappers[dev].items():
                if getattr(w, "_cached_module", None) is None:  # expect: FC103
                    raise RuntimeError(f"cuda:{dev}: the {name} wrapper has no compiled module after warm-up")

    def set_shared_prefix(self, dev: int, pages: List[int]) -> None:
        assert pages, "an empty shared prefix"  # expect: FC109
        self.prefix_pages[dev] = list(pages)
        self.prefix_indices[dev] = torch.tensor(pages, dtype=torch.int32, device=torch.device("cuda", dev))

    def needs_overflow(self, batch: DeviceBatch) -> bool:
        long_ctx = bool((batch.seq_lens_cpu > self.cfg.long_prompt_tokens).any())  # ok: FC101
        return long_ctx or batch.batch_size > self.cfg.max_bucket

    def init_forward_metadata(self, dev: int, batch: DeviceBatch) -> None:
        assert dev in self.wrappers, f"cuda:{dev} is not served by this pool"  # expect: FC109
        if batch.is_prefill:  # ok: FC101
            return self.plan_prefill(dev, batch) if batch.has_prefix else self.plan_ragged(dev, batch)
        self.route[dev] = "overflow" if self.needs_overflow(batch) else "decode"
        if self.route[dev] == "overflow":
            self.plan_overflow(dev, batch)
        else:
            self.plan_decode(dev, batch)
        self.plan_swa(dev, batch)

    def plan_prefill(self, dev: int, batch: DeviceBatch) -> None:
        self.wrappers[dev]["prefill"].plan(batch.qo_indptr, batch.kv_indptr_cpu, batch.kv_indices,  # expect: FC102
                                           batch.kv_last_page_len_cpu, *self.cfg.plan_dims, causal=True,
                                           sm_scale=self._sm_scale)  # ok: FC103
        self._plan_info[dev] = "prefill"  # ok: FC103

    def plan_ragged(self, dev: int, batch: DeviceBatch) -> None:
        cfg, plan = self.cfg, self.wrappers[dev]["ragged"].plan
        plan(qo_indptr=batch.qo_indptr_cpu, kv_indptr=batch.qo_indptr_cpu, num_qo_heads=cfg.num_qo_heads,  # ok: FC102
             num_kv_heads=cfg.num_kv_heads, head_dim_qk=cfg.head_dim, causal=True)

    def plan_decode(self, dev: int, batch: DeviceBatch) -> None:
        bs, dims, i32 = batch.batch_size, self.cfg.plan_dims, torch.int32
        w = self.wrappers[dev]["decode_tc"] if bs >= self.cfg.tensor_core_min_bucket else self.wrappers[dev]["decode"]
        w.plan(batch.kv_indptr_cpu, batch.kv_indices, batch.kv_last_page_len_cpu, *dims)  # ok: FC102
        if self.prefix_pages[dev]:  # all rows attend the shared prefix as one query group
            n_pre = len(self.prefix_pages[dev])
            self.wrappers[dev]["prefix"].plan(  # ok: FC102
                torch.tensor([0, bs], dtype=i32), torch.tensor([0, n_pre], dtype=i32), self.prefix_indices[dev],
                torch.tensor([PAGE_SIZE], dtype=i32), *dims, causal=False)

    def plan_overflow(self, dev: int, batch: DeviceBatch) -> None:
        if batch.batch_size > self.cfg.max_running_per_device:
            raise ValueError(f"cuda:{dev}: {batch.batch_size} rows, lengths {batch.seq_lens}")  # ok: FC101
        self.wrappers[dev]["overflow"].plan(batch.kv_indptr_cpu, batch.kv_indices, batch.kv_last_page_len,  # expect: FC102
                                            *self.cfg.plan_dims)
        # the overflow kernels read the lengths from the pool's buffer, which is sized for the buckets
        self.seq_lens_buf[dev].resize_(batch.batch_size)  # expect: FC107
        self.seq_lens_buf[dev].copy_(batch.seq_lens)

    def plan_swa(self, dev: int, batch: DeviceBatch) -> None:
        # no row outgrows the window: plan full attention, which is cheaper
        window_left = SWA_WINDOW - 1 if (batch.seq_lens_cpu > SWA_WINDOW).any() else -1  # ok: FC101
        last = last_page_lens(batch.seq_lens, PAGE_SIZE)
        self.wrappers[dev]["swa"].plan(batch.kv_indptr_cpu, batch.kv_indices, last,  # expect: FC102
                                       *self.cfg.plan_dims, window_left=window_left)

    def plan_dummy_bucket(self, dev: int, bs: int) -> None:
        indptr = self.kv_indptr_buf[dev]
        indptr[: bs + 1].copy_(torch.arange(bs + 1, dtype=torch.int32))  # ok: FC104
        self.last_page_buf[dev][:bs].fill_(1)  # ok: FC104
        self.graph_wrappers[(dev, bs)].plan(indptr[: bs + 1], self.kv_indices_buf[dev][:bs],  # expect: FC102
                                            self.last_page_buf[dev][:bs], *self.cfg.plan_dims)

    def plan_bucket(self, dev: int, bs: int, batch: DeviceBatch) -> None:
        cfg, n = self.cfg, batch.batch_size
        nnz = int(batch.kv_indptr_cpu[-1])  # ok: FC101
        host, last_host = self.indptr_host[dev], self.last_page_host[dev]
        host[: n + 1].copy_(batch.kv_indptr_cpu)
        host[n + 1 : bs + 1] = nnz
        last_host[:n].copy_(batch.kv_last_page_len_cpu)
        last_host[n:bs] = 1
        self.kv_indptr_buf[dev][: bs + 1].copy_(host[: bs + 1], non_blocking=True)  # ok: FC104
        self.kv_indices_buf[dev][:nnz].copy_(batch.kv_indices, non_blocking=True)  # ok: FC104
        self.last_page_buf[dev][:bs].copy_(last_host[:bs], non_blocking=True)  # ok: FC104
        w = self.graph_wrappers[(dev, bs)]
        if cfg.fast_plan:
            self._fast_plan(w, indptr=host[: bs + 1], indices=self.kv_indices_buf[dev],  # expect: FC102
                            last_page_len=self.last_page_buf[dev][:bs], num_qo_heads=cfg.num_qo_heads,
                            num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim, page_size=PAGE_SIZE)
        else:
            w.plan(host[: bs + 1], self.kv_indices_buf[dev], last_host[:bs], *cfg.plan_dims)  # ok: FC102
        self.seq_lens_buf[dev][:n].copy_(batch.seq_lens, non_blocking=True)  # ok: FC104
        host[bs + 1 :] = nnz  # ok: FC104
        self.kv_indptr_buf[dev][bs + 1 :].fill_(nnz)  # expect: FC104

    def attend_decode(self, dev: int, bs: int, q: torch.Tensor, kv_cache: torch.Tensor, capturing: bool) -> torch.Tensor:
        if not capturing and self.route.get(dev) == "overflow":
            o, lse = self.wrappers[dev]["overflow"].run(q, kv_cache, return_lse=True)  # ok: FC108
        elif bs == 1:  # one row: the split-k CUDA-core kernel has the lowest latency
            o, lse = self.wrappers[dev]["decode"].run(q, kv_cache, return_lse=True)  # expect: FC108
        elif bs >= self.cfg.tensor_core_min_bucket:  # GQA groups of four and more: tensor cores win
            o, lse = self.wrappers[dev]["decode_tc"].run(q, kv_cache, return_lse=True)  # expect: FC108
        else:
            w = self.graph_wrappers[(dev, bs)] if self.cfg.use_graphs else self.wrappers[dev]["decode"]
            o, lse = w.run(q, kv_cache, return_lse=True)  # ok: FC108
        if self.prefix_pages[dev]:
            o_pre, lse_pre = self.wrappers[dev]["prefix"].run_return_lse(q, kv_cache)  # expect: FC108
            o, lse = merge_state(o_pre, lse_pre, o, lse)
        return o

    def can_replay(self, dev: int, bs: int) -> bool:
        w = self.graph_wrappers.get((dev, bs))
        if w is None or not w.is_cuda_graph_enabled:  # ok: FC103
            return False
        return vars(w).get("_fixed_batch_size") == bs  # expect: FC103

    def stats(self) -> Dict[str, object]:
        out: Dict[str, object] = {f"cuda:{d}/prefill": ws["prefill"]._plan_info for d, ws in self.wrappers.items()}  # expect: FC103
        out.update({f"cuda:{d}/bs{bs}": w._int_workspace_buffer.numel() for (d, bs), w in self.graph_wrappers.items()})  # expect: FC103
        out.update({f"cuda:{d}/bs{bs}/{f}": getattr(w, f).data_ptr() for (d, bs), w in self.graph_wrappers.items()  # expect: FC103
                    for f in _BOUND_BUFFER_FIELDS})
        return out

    def disable_graphs(self, dev: int) -> None:
        for bs in self.cfg.graph_buckets:
            setattr(self.graph_wrappers[(dev, bs)], "_use_cuda_graph", False)  # expect: FC103
        self.kv_indptr_buf[dev].zero_()  # expect: FC104
