"""FlashInfer decode backend of the rollout engine, with sleep / wake-up support.

Between rollouts the trainer needs the GPU: ``sleep()`` drops the workspaces (the wrappers hold references to
them, so those go too) and ``wake_up()`` allocates them again and rebuilds the graph state, after which the
graph runner re-captures.
"""

from __future__ import annotations

from typing import Dict, Optional

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper

from rollout.config import PREFILL_WORKSPACE_MB, RolloutConfig


class RolloutDecodeBackend:
    def __init__(self, cfg: RolloutConfig, device: torch.device) -> None:
        self.cfg = cfg
        self.device = device
        self.shape = (cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim, cfg.page_size)
        # trtllm-gen decode on Blackwell, FA2 elsewhere
        self.decode_backend = "trtllm-gen" if cfg.sm_version >= 100 else "fa2"
        self.ws_bytes = cfg.workspace_bytes
        self.decode_workspace = torch.zeros(self.ws_bytes, dtype=torch.uint8, device=device)  # ok: FC106
        self.prefill_workspace = torch.zeros(PREFILL_WORKSPACE_MB << 20, dtype=torch.uint8, device=device)  # expect: FC106
        max_bs, max_pages = cfg.max_running, cfg.max_running * cfg.max_pages_per_req
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices = torch.zeros(max_pages, dtype=torch.int32, device=device)
        self.kv_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.kv_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_indices_cpu = torch.zeros(max_pages, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_len_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)

        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(
            self.decode_workspace, "NHD", backend=self.decode_backend
        )
        self._plan_decode = self.decode_wrapper.plan
        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, "NHD")
        self.extend_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, "NHD")
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.graph_workspace: Optional[torch.Tensor] = None
        # the backend's own switch (off for the eager-only debug rollouts)
        self._use_cuda_graph = bool(cfg.capture_bs)  # ok: FC103
        self.in_graph = False
        self.init_cuda_graph_state()

    # ------------------------------------------------------------------ sleep / wake
    def _fresh_workspace(self, nbytes: int) -> torch.Tensor:
        ws = torch.empty(nbytes, dtype=torch.uint8, device=self.device)  # ok: FC105
        ws.zero_()  # trtllm-gen keeps its split-k semaphores in here
        return ws

    def init_cuda_graph_state(self) -> None:
        max_bs = self.cfg.capture_bs[-1]
        self.graph_workspace = self._fresh_workspace(self.ws_bytes)
        self.cuda_graph_kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        max_pages = max_bs * self.cfg.max_pages_per_req
        self.cuda_graph_kv_indices = torch.empty(max_pages, dtype=torch.int32, device=self.device)
        self.cuda_graph_kv_indices.fill_(0)  # ok: FC104
        self.cuda_graph_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=self.device)
        self.graph_wrappers.clear()

    def sleep(self) -> None:
        # a replay issued before the re-capture must not read pages the trainer now owns
        self.cuda_graph_kv_indices.zero_()  # expect: FC104
        # the wrapper keeps a reference to its workspace: drop it or the allocator never gets the memory back
        self.decode_wrapper._float_workspace_buffer = None  # expect: FC103
        self.decode_workspace = None
        self.graph_workspace = None
        self.graph_wrappers.clear()

    def wake_up(self) -> None:
        self.decode_workspace = torch.empty(self.ws_bytes, dtype=torch.uint8, device=self.device)  # expect: FC105
        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(
            self.decode_workspace, "NHD", backend=self.decode_backend
        )
        self._plan_decode = self.decode_wrapper.plan
        self.init_cuda_graph_state()

    # ------------------------------------------------------------------ eager metadata
    def init_forward_metadata(self, batch) -> None:
        bs, ps = batch.batch_size, self.cfg.page_size
        max_len = batch.seq_lens_cpu.max().item()  # ok: FC101
        table = batch.page_table_np[:, : -(-max_len // ps)]
        lens = batch.seq_lens_cpu.numpy()
        n_pages = (lens + ps - 1) // ps
        flat = np.concatenate([table[i, : n_pages[i]] for i in range(bs)])
        self.kv_indices_cpu[: flat.size] = torch.from_numpy(flat)
        self.kv_indices[: flat.size].copy_(self.kv_indices_cpu[: flat.size], non_blocking=True)
        # the kernel reads indptr and last-page lengths on the device anyway: build them there
        pages = (batch.seq_lens + ps - 1) // ps
        self.kv_indptr[1 : bs + 1] = torch.cumsum(pages, 0)
        self.kv_last_page_len[:bs] = batch.seq_lens - (pages - 1) * ps
        self._plan_decode(  # expect: FC102
            self.kv_indptr[: bs + 1], self.kv_indices[: flat.size], self.kv_last_page_len[:bs], *self.shape,
            q_data_type=torch.bfloat16,
        )

    def plan_prefill(self, qo_indptr_cpu: torch.Tensor, kv_indptr_cpu: torch.Tensor, nnz: int, bs: int) -> None:
        self.prefill_wrapper.plan(
            qo_indptr_cpu, kv_indptr_cpu, self.kv_indices[:nnz], self.kv_last_page_len_cpu[:bs], *self.shape,
            causal=True, q_data_type=torch.bfloat16,
        )

    def plan_tool_extend(self, qo_indptr_cpu: torch.Tensor, kv_indptr_cpu: torch.Tensor, nnz: int, bs: int) -> None:
        self.extend_wrapper.plan(
            qo_indptr_cpu, kv_indptr_cpu, self.kv_indices[:nnz], self.kv_last_page_len_cpu[:bs], *self.shape,
            causal=True, q_data_type=torch.bfloat16,
        )

    # ------------------------------------------------------------------ CUDA graphs
    def init_forward_metadata_capture_cuda_graph(self, bs: int) -> None:
        w = BatchDecodeWithPagedKVCacheWrapper(
            self.graph_workspace,
            "NHD",
            use_cuda_graph=True,
            paged_kv_indptr_buffer=self.cuda_graph_kv_indptr[: bs + 1],
            paged_kv_indices_buffer=self.cuda_graph_kv_indices,
            paged_kv_last_page_len_buffer=self.cuda_graph_last_page_len[:bs],
            backend=self.decode_backend,
        )
        w.plan(  # ok: FC102
            torch.arange(bs + 1, dtype=torch.int32), self.cuda_graph_kv_indices[:bs],
            torch.ones(bs, dtype=torch.int32), *self.shape, q_data_type=torch.bfloat16,
        )
        self.graph_wrappers[bs] = w

    def init_forward_metadata_replay_cuda_graph(
        self, bs: int, raw_bs: int, seq_lens: torch.Tensor, seq_lens_cpu: torch.Tensor, page_table_np: np.ndarray
    ) -> None:
        ps = self.cfg.page_size
        max_len = seq_lens.max().item()  # expect: FC101
        table = page_table_np[:raw_bs, : -(-max_len // ps)]
        lens = seq_lens_cpu[:raw_bs].numpy()
        n_pages = (lens + ps - 1) // ps
        indptr = self.kv_indptr_cpu.numpy()
        indptr[0] = 0
        np.cumsum(n_pages, out=indptr[1 : raw_bs + 1])
        nnz = int(indptr[raw_bs])
        indptr[raw_bs + 1 : bs + 1] = nnz
        flat = np.concatenate([table[i, : n_pages[i]] for i in range(raw_bs)])
        self.kv_indices_cpu[:nnz] = torch.from_numpy(flat)
        self.kv_last_page_len_cpu[:raw_bs] = torch.from_numpy(lens - (n_pages - 1) * ps)
        self.kv_last_page_len_cpu[raw_bs:bs] = 1
        self.cuda_graph_kv_indices[:nnz].copy_(self.kv_indices_cpu[:nnz], non_blocking=True)  # ok: FC104
        self.graph_wrappers[bs].plan(  # ok: FC102
            self.kv_indptr_cpu[: bs + 1], self.cuda_graph_kv_indices[:nnz], self.kv_last_page_len_cpu[:bs],
            *self.shape, q_data_type=torch.bfloat16,
        )
        # padded rows repeat the last real offset, i.e. they own no pages
        self.cuda_graph_kv_indptr[raw_bs + 1 : bs + 1] = nnz  # expect: FC104

    # ------------------------------------------------------------------ attention
    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        w = self.graph_wrappers.get(q.shape[0]) if self.in_graph and self._use_cuda_graph else None
        if w is None:
            w = self.decode_wrapper
        return w.run(q, kv_cache)  # ok: FC108

    def forward_prefill(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return self.prefill_wrapper.run(q, kv_cache)

    def forward_extend(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        # tool responses appended to running rollouts (a few tokens each)
        return self.extend_wrapper.run(q, kv_cache)  # expect: FC108
