"""FlashInfer attention for the policy: eager observation / instruction prefill and one
graph-mode decode wrapper per step of every captured action chunk."""
from __future__ import annotations

import itertools
from typing import Dict, List

import numpy as np
import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    CUDAGraphBatchDecodeWithPagedKVCacheWrapper,
    trtllm_batch_decode_with_kv_cache,
)

from vlapolicy.config import PolicyConfig, WsSize
from vlapolicy.policy.workspace import trtllm_workspace


class PolicyAttention:
    def __init__(self, cfg: PolicyConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self._backend = "fa2"
        self.sm_scale = cfg.head_dim ** -0.5
        R, H = cfg.num_robots, cfg.max_chunk

        self.obs_workspace = torch.zeros(WsSize.OBS_PREFILL, dtype=torch.uint8, device=self.device)  # expect: FC106
        self.step_workspaces = [
            torch.empty(cfg.step_workspace_bytes(), dtype=torch.uint8, device=self.device) for _ in range(H)  # ok: FC105
        ]
        self.obs_prefill = BatchPrefillWithPagedKVCacheWrapper(self.obs_workspace, "NHD", backend=self._backend)  # ok: FC103
        self.instr_prefill = BatchPrefillWithPagedKVCacheWrapper(self.obs_workspace, "NHD", backend="fa2")
        self.first_step_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.step_workspaces[0], "NHD")

        # bound to the per-step graph wrappers: row j serves decode step j of a chunk
        self.kv_indptr = torch.zeros(H, R + 1, dtype=torch.int32, device=self.device)
        self.kv_indices = torch.zeros(R * cfg.max_pages_per_robot, dtype=torch.int32, device=self.device)
        self.kv_last_page_len = torch.ones(H, R, dtype=torch.int32, device=self.device)
        self.kv_indptr_host = torch.zeros(H, R + 1, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_len_host = torch.ones(H, R, dtype=torch.int32, pin_memory=True)
        # positions of the first action token of each robot (rotary), not bound to any wrapper
        self.chunk_positions = torch.zeros(R, dtype=torch.int64, device=self.device)
        self.step_wrappers: Dict[int, List[CUDAGraphBatchDecodeWithPagedKVCacheWrapper]] = {}

    # -- set-up ------------------------------------------------------------------------

    def init_chunk_buffers(self, chunk_sizes) -> None:
        for h in chunk_sizes:
            self.step_wrappers[h] = [
                CUDAGraphBatchDecodeWithPagedKVCacheWrapper(
                    self.step_workspaces[j], self.kv_indptr[j], self.kv_indices, self.kv_last_page_len[j], "NHD"
                )
                for j in range(h)
            ]
        self.kv_last_page_len.fill_(1)  # ok: FC104

    def graph_memory_bytes(self) -> int:
        total = 0
        for w in itertools.chain.from_iterable(self.step_wrappers.values()):
            total += w._float_workspace_buffer.numel()  # expect: FC103
        return total

    # -- planning ----------------------------------------------------------------------

    def plan_obs(self, tick) -> None:
        """Observation tokens attend causally after the instruction and earlier frames."""
        n_obs = self.cfg.obs_tokens_per_robot
        qo_indptr = torch.arange(self.cfg.num_robots + 1, dtype=torch.int32, device=self.device) * n_obs
        args = (qo_indptr, tick.kv_indptr_cpu, tick.kv_indices, tick.kv_last_page_len_cpu)
        self.obs_prefill.plan(  # expect: FC102
            *args,
            self.cfg.num_qo_heads,
            self.cfg.num_kv_heads,
            self.cfg.head_dim,
            self.cfg.page_size,
            causal=True,
            sm_scale=self.sm_scale,
        )

    def plan_instruction(
        self,
        qo_indptr_cpu: torch.Tensor,
        kv_indptr_cpu: torch.Tensor,
        kv_indices: torch.Tensor,
        seq_lens_gpu: torch.Tensor,
    ) -> None:
        last_page_len = (seq_lens_gpu - 1) % self.cfg.page_size + 1
        self.instr_prefill.plan(  # expect: FC102
            qo_indptr_cpu,
            kv_indptr_cpu,
            kv_indices,
            last_page_len,
            self.cfg.num_qo_heads,
            self.cfg.num_kv_heads,
            self.cfg.head_dim,
            self.cfg.page_size,
            causal=True,
        )

    def plan_chunk(
        self,
        h: int,
        kv_indptr_rows: np.ndarray,
        last_rows: np.ndarray,
        kv_indices: torch.Tensor,
        positions: torch.Tensor,
    ) -> None:
        """Plan every decode step of a chunk before its graph replays (step j sees j more tokens)."""
        nnz = int(kv_indptr_rows[h - 1, -1])
        self.kv_indices[:nnz].copy_(kv_indices[:nnz], non_blocking=True)
        for j, w in enumerate(self.step_wrappers[h]):
            self.kv_indptr_host[j].copy_(torch.from_numpy(kv_indptr_rows[j]))
            self.kv_last_page_len_host[j].copy_(torch.from_numpy(last_rows[j]))
            self.kv_indptr[j].copy_(self.kv_indptr_host[j], non_blocking=True)  # ok: FC104
            w.plan(  # ok: FC102
                self.kv_indptr_host[j],
                self.kv_indices,
                self.kv_last_page_len_host[j],
                self.cfg.num_qo_heads,
                self.cfg.num_kv_heads,
                self.cfg.head_dim,
                self.cfg.page_size,
                sm_scale=self.sm_scale,
            )
        if self.cfg.first_step_eager:
            self.first_step_wrapper.plan(
                self.kv_indptr_host[0],
                self.kv_indices,
                self.kv_last_page_len_host[0],
                self.cfg.num_qo_heads,
                self.cfg.num_kv_heads,
                self.cfg.head_dim,
                self.cfg.page_size,
                sm_scale=self.sm_scale,
            )
        self.chunk_positions.copy_(positions, non_blocking=True)  # ok: FC104

    # -- kernels -----------------------------------------------------------------------

    def obs_attend(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return self.obs_prefill.run(q, kv_cache)

    def instruction_attend(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return self.instr_prefill.run(q, kv_cache)

    def decode_step(self, q: torch.Tensor, kv_cache: torch.Tensor, h: int, j: int) -> torch.Tensor:
        if j == 0 and self.cfg.first_step_eager:
            # the first action token follows freshly written observation pages
            return self.first_step_wrapper.run(q, kv_cache)  # expect: FC108
        return self.step_wrappers[h][j].run(q, kv_cache)  # ok: FC108

    def decode_step_fleet(
        self, q: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor, max_len: int
    ) -> torch.Tensor:
        """Fleets larger than the captured graphs decode eagerly on trtllm-gen."""
        ws = trtllm_workspace(self.cfg.fleet_decode_workspace_bytes(q.shape[0]), self.device.index or 0)
        return trtllm_batch_decode_with_kv_cache(
            q, kv_cache, ws, block_tables, seq_lens, max_len, self.sm_scale, 1.0
        )
