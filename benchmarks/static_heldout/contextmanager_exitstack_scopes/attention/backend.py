"""FlashInfer backend whose capture and replay preparation are ``contextlib.contextmanager`` scopes."""
from __future__ import annotations

import contextlib
import functools
import logging
from typing import Dict, Iterator, List, Optional

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper as DecodeWrapper
from flashinfer import BatchPrefillWithPagedKVCacheWrapper, BatchPrefillWithRaggedKVCacheWrapper

from scopes.batch import DecodeBatch, ExtendBatch
from scopes.config import LOCAL_WORKSPACE_MB, WINDOW_WORKSPACE_BYTES, EngineConfig, softcap_workspace_bytes

logger = logging.getLogger(__name__)


def _check_bucket(bs: int, wrappers: Dict[int, DecodeWrapper]) -> None:
    assert bs in wrappers, f"no decode graph for batch size {bs}"  # expect: FC109


def shared_workspace(nbytes: int, device: torch.device) -> torch.Tensor:
    """Float workspace of the FA2 wrappers: no counters in it, so fresh memory is fine."""
    return torch.empty(nbytes, dtype=torch.uint8, device=device)  # ok: FC105


class FlashInferScopedBackend:
    def __init__(self, cfg: EngineConfig, device: torch.device) -> None:
        self.cfg, self.device = cfg, device
        self._kv_layout = "NHD"  # ok: FC103
        self._plan_info: Dict[int, object] = {}  # ok: FC103
        max_bs = cfg.max_batch_size
        self.workspace = shared_workspace(cfg.split_kv_workspace_bytes(), device)
        prefill_workspace = torch.empty(cfg.prefill_workspace_bytes, dtype=torch.uint8, device=device)  # ok: FC106
        window_workspace = torch.empty(WINDOW_WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        softcap_workspace = torch.empty(softcap_workspace_bytes(), dtype=torch.uint8, device=device)  # expect: FC106
        local_workspace = torch.empty(LOCAL_WORKSPACE_MB << 20, dtype=torch.uint8, device=device)  # expect: FC106
        ragged_workspace = torch.empty(cfg.max_num_tokens * cfg.num_qo_heads * 512, dtype=torch.uint8, device=device)  # ok: FC106
        # Graph-bound inputs shared by every bucket's wrapper, and the pinned mirrors plan() reads.
        self.kv_indptr_buf = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices_buf = torch.zeros(cfg.max_pages, dtype=torch.int32, device=device)
        self.kv_last_page_buf = torch.empty(max_bs, dtype=torch.int32, device=device)
        self.kv_last_page_buf.fill_(1)  # ok: FC104
        self.kv_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.eager_kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.eager_kv_indices = torch.zeros(cfg.max_pages, dtype=torch.int32, device=device)
        self.dummy_indices: Optional[torch.Tensor] = None
        layout = self._kv_layout  # ok: FC103
        self.decode_wrapper = DecodeWrapper(self.workspace, layout)
        self.window_wrapper = DecodeWrapper(window_workspace, layout)
        self.softcap_wrapper = DecodeWrapper(softcap_workspace, layout)
        self.local_wrapper = BatchPrefillWithPagedKVCacheWrapper(local_workspace, layout)
        self.extend_wrapper = BatchPrefillWithPagedKVCacheWrapper(prefill_workspace, layout)
        self.ragged_wrapper = BatchPrefillWithRaggedKVCacheWrapper(ragged_workspace, layout)
        self.graph_wrappers: Dict[int, DecodeWrapper] = {}
        self.capturing_bs: Optional[int] = None
        self.tokens_served = 0
        self.prev_seq_lens: Optional[torch.Tensor] = None

    def init_graph_wrappers(self) -> None:
        assert not self.graph_wrappers, "init_graph_wrappers() runs once"  # ok: FC109
        self.kv_indptr_buf.zero_()  # ok: FC104
        for bs in self.cfg.graph_buckets:
            self.graph_wrappers[bs] = DecodeWrapper(
                self.workspace, self._kv_layout, use_cuda_graph=True, paged_kv_indptr_buffer=self.kv_indptr_buf[: bs + 1],
                paged_kv_indices_buffer=self.kv_indices_buf, paged_kv_last_page_len_buffer=self.kv_last_page_buf[:bs])

    @contextlib.contextmanager
    def bucket_scope(self, bs: int, batch: DecodeBatch) -> Iterator[DecodeWrapper]:
        """Fill bucket ``bs``'s graph inputs and plan it; the caller replays inside the block."""
        _check_bucket(bs, self.graph_wrappers)
        wrapper, n = self.graph_wrappers[bs], batch.num_reqs
        if int(batch.seq_lens.max()) > self.cfg.max_seq_len:  # expect: FC101
            raise ValueError(f"bucket {bs}: sequence lengths {batch.seq_lens} exceed max_seq_len")  # ok: FC101
        if batch.num_pages > self.kv_indices_buf.numel():
            self.kv_indices_buf = torch.empty(batch.num_pages, dtype=torch.int32, device=self.device)  # expect: FC107
        self.kv_indices_buf[: batch.num_pages].copy_(batch.kv_indices, non_blocking=True)  # ok: FC104
        self.kv_indptr_cpu[: n + 1].copy_(batch.kv_indptr_cpu)  # ok: FC101
        self.kv_indptr_cpu[n + 1 : bs + 1] = batch.kv_indptr_cpu[n]
        self.kv_last_page_cpu[:n].copy_(batch.kv_last_page_len_cpu)
        wrapper.plan(  # ok: FC102
            self.kv_indptr_cpu[: bs + 1], self.kv_indices_buf, self.kv_last_page_cpu[:bs], *self.cfg.plan_dims(), data_type=torch.bfloat16)
        self._plan_info[bs] = wrapper._plan_info  # expect: FC103
        self.kv_last_page_buf[n:bs].fill_(1)  # expect: FC104
        yield wrapper
        # After the replay: clear the padded rows so the next bucket starts from a clean indptr.
        self.kv_indptr_buf[n + 1 : bs + 1].zero_()  # ok: FC104
        self.tokens_served += batch.seq_lens.sum().item()  # expect: FC101
        self.prev_seq_lens = batch.seq_lens.clone()  # expect: FC107
        logger.debug("replayed bucket %d for %d requests, lens %s", bs, n, batch.seq_lens)  # ok: FC101

    def init_capture_inputs(self, bs: int) -> None:  # dummy requests for capture: one page each
        self.kv_indptr_cpu[: bs + 1] = torch.arange(bs + 1, dtype=torch.int32)
        self.kv_last_page_cpu[:bs].fill_(1)
        self.dummy_indices = torch.arange(bs, dtype=torch.int32, device=self.device)  # ok: FC107
        self.kv_indices_buf[:bs].copy_(self.dummy_indices)  # ok: FC104

    @contextlib.contextmanager
    def capture_scope(self, bs: int) -> Iterator[DecodeWrapper]:
        assert bs <= self.cfg.max_batch_size, f"bucket {bs} exceeds max_batch_size"  # expect: FC109
        wrapper = self.graph_wrappers[bs]
        if wrapper._fixed_batch_size != bs:  # expect: FC103
            raise RuntimeError(f"graph wrapper for bucket {bs} was built for another batch size")
        self.init_capture_inputs(bs)
        wrapper.plan(self.kv_indptr_cpu[: bs + 1], self.kv_indices_buf, self.kv_last_page_cpu[:bs], *self.cfg.plan_dims())  # ok: FC102
        torch.cuda.synchronize()  # ok: FC101
        if self.kv_indptr_buf[bs] != bs:  # expect: FC101
            raise RuntimeError("plan() did not stage the dummy indptr into the graph buffer")
        self.capturing_bs = bs
        try:
            yield wrapper
        finally:
            self.capturing_bs = None
            self.kv_indptr_buf.zero_()  # expect: FC104
        logger.info(f"captured decode bucket {bs}, last-page lens {self.kv_last_page_buf[:bs]}")  # expect: FC101

    def plan_eager(self, batch: DecodeBatch) -> None:
        cfg, n = self.cfg, batch.num_reqs
        self.eager_kv_indices.resize_(batch.num_pages)  # expect: FC107
        self.eager_kv_indices.copy_(batch.kv_indices)
        self.eager_kv_indptr[: n + 1].copy_(batch.kv_indptr)
        self.decode_wrapper.plan(self.eager_kv_indptr[: n + 1], self.eager_kv_indices, batch.kv_last_page_len_cpu, *self.cfg.plan_dims())  # expect: FC102
        window_left = cfg.sliding_window - 1 if int(batch.seq_lens_cpu.max()) > cfg.sliding_window else -1  # ok: FC101
        plan_window = functools.partial(self.window_wrapper.plan, window_left=window_left)
        plan_window(batch.kv_indptr_cpu, batch.kv_indices, batch.kv_last_page_len, *self.cfg.plan_dims())  # expect: FC102
        self.softcap_wrapper.plan(  # ok: FC102
            batch.kv_indptr_cpu, batch.kv_indices, batch.kv_last_page_len_cpu, *self.cfg.plan_dims(), logits_soft_cap=cfg.logits_soft_cap)
        qo_indptr_cpu = torch.arange(n + 1, dtype=torch.int32)
        self.local_wrapper.plan(  # expect: FC102
            qo_indptr_cpu, batch.kv_indptr, batch.kv_indices, batch.kv_last_page_len_cpu, *self.cfg.plan_dims(), window_left=window_left)

    def plan_extend(self, batch: ExtendBatch) -> None:
        cfg = self.cfg
        qo_indptr = torch.zeros(batch.num_reqs + 1, dtype=torch.int32, device=self.device)
        torch.cumsum(batch.extend_lens, 0, out=qo_indptr[1:])
        if int(qo_indptr[-1]) != batch.num_tokens:  # expect: FC101
            raise ValueError("extend lengths disagree with the flattened token count")
        if max(batch.extend_lens_cpu.tolist()) > cfg.max_num_tokens:  # ok: FC101
            raise ValueError("an extend chunk exceeds max_num_tokens")
        if batch.fresh:
            self.ragged_wrapper.plan(  # ok: FC102
                batch.qo_indptr_cpu, batch.qo_indptr_cpu, cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim, causal=True)
        self.extend_wrapper.plan(  # expect: FC102
            qo_indptr, batch.kv_indptr_cpu, batch.kv_indices, batch.kv_last_page_len_cpu, *self.cfg.plan_dims(), causal=True)
        # New pages were appended: the cached decode plans describe a stale page layout.
        self._plan_info.clear()  # ok: FC103

    def reset_rows(self, rows: List[int]) -> None:  # aborted requests: back to the one-token default
        self.kv_last_page_buf[rows] = 1  # expect: FC104
        self.kv_last_page_cpu[rows] = 1  # ok: FC104

    def warmup_buckets(self) -> None:
        # One plan per eager wrapper at start-up, so the JIT modules load before serving.
        for bs in (1, self.cfg.max_batch_size):
            dummy_indptr = torch.arange(bs + 1, dtype=torch.int32, device=self.device)
            self.decode_wrapper.plan(dummy_indptr, self.eager_kv_indices[:bs], self.kv_last_page_cpu[:bs], *self.cfg.plan_dims())  # expect: FC102
            host_indptr = torch.arange(bs + 1, dtype=torch.int32)
            self.window_wrapper.plan(host_indptr, self.eager_kv_indices[:bs], self.kv_last_page_cpu[:bs], *self.cfg.plan_dims())  # ok: FC102
        if getattr(self.decode_wrapper, "_cached_module", None) is None:  # expect: FC103
            raise RuntimeError("FlashInfer decode module failed to JIT-compile")

    def debug_dump(self) -> Dict[str, int]:  # operator endpoint, never on the step path
        return {"indptr_tail": self.kv_indptr_buf[-1].item(), "tokens_served": self.tokens_served}  # ok: FC101
