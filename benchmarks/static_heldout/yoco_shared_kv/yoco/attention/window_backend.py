"""Self-decoder attention: sliding windows over each request's page ring.

Local-window layers decode through graph-mode wrappers (one per captured batch size, bound to this backend's
buffers). Wide-window layers are few and their page lists long; they share one eager wrapper that is planned every
step. Prompts are prefilled one request at a time with ``single_prefill_with_kv_cache``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, single_prefill_with_kv_cache

from yoco.attention.base import AttentionBackend
from yoco.config import ServerArgs, YocoConfig, _default_window_workspace_bytes
from yoco.forward_batch import ForwardBatch
from yoco.mem.pools import WindowKVPool
from yoco.mem.ring_kernels import gather_window_pages


@dataclass
class WindowMetadata:
    local_wrapper: Optional[BatchDecodeWithPagedKVCacheWrapper] = None


class WindowAttnBackend(AttentionBackend):
    def __init__(self, cfg: YocoConfig, server_args: ServerArgs, pool: WindowKVPool, device: torch.device):
        self.cfg = cfg
        self.pool = pool
        self.device = device
        self.page_size = server_args.page_size
        self.local_window = cfg.local_window
        self.wide_window = cfg.wide_window
        self._window_left = cfg.local_window - 1  # ok: FC103
        self.window_workspace = torch.empty(_default_window_workspace_bytes(), dtype=torch.uint8, device=device)  # expect: FC106

        max_bs = max(server_args.graph_batch_sizes)
        local_pages = cfg.local_window // self.page_size + 1
        self.win_kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.win_kv_indices = torch.zeros(max_bs * local_pages, dtype=torch.int32, device=device)
        self.win_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.win_kv_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.win_last_page_len_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.wide_kv_indptr_cpu = torch.zeros(server_args.max_running_requests + 1, dtype=torch.int32, pin_memory=True)
        self.eager_local_indptr_cpu = torch.zeros(server_args.max_running_requests + 1, dtype=torch.int32, pin_memory=True)
        self.eager_last_page_cpu: Optional[torch.Tensor] = None

        self.decode_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.eager_local = BatchDecodeWithPagedKVCacheWrapper(self.window_workspace, "NHD", backend="fa2")
        self.wide_decode = BatchDecodeWithPagedKVCacheWrapper(self.window_workspace, "NHD", backend="fa2")
        self.forward_metadata = WindowMetadata()

    def _plan_kwargs(self) -> dict:
        c = self.cfg
        return dict(
            num_qo_heads=c.num_heads,
            num_kv_heads=c.num_kv_heads,
            head_dim=c.head_dim,
            page_size=self.page_size,
            q_data_type=torch.bfloat16,
        )

    def _plan_wide(self, slots_np: np.ndarray, seq_lens_np: np.ndarray) -> None:
        bs = len(slots_np)
        indptr_np, indices_np, last_np = self.pool.window_lists(slots_np, seq_lens_np, self.wide_window)
        self.wide_kv_indptr_cpu.numpy()[: bs + 1] = indptr_np
        self.wide_decode.plan(  # ok: FC102
            self.wide_kv_indptr_cpu[: bs + 1],
            torch.from_numpy(indices_np).to(self.device, non_blocking=True),
            torch.from_numpy(last_np),
            window_left=self.wide_window - 1,
            **self._plan_kwargs(),
        )

    # ------------------------------------------------------------------ eager
    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        if fb.forward_mode.is_decode():
            bs = fb.batch_size
            seq_lens_np = fb.seq_lens_cpu.numpy()
            indptr_np, indices_np, last_np = self.pool.window_lists(fb.req_slots_np, seq_lens_np, self.local_window)
            self.eager_local_indptr_cpu.numpy()[: bs + 1] = indptr_np
            self.eager_last_page_cpu = torch.empty(bs, dtype=torch.int32, pin_memory=True)  # ok: FC107
            self.eager_last_page_cpu.numpy()[:] = last_np
            self.eager_local.plan(
                self.eager_local_indptr_cpu[: bs + 1],
                torch.from_numpy(indices_np).to(self.device, non_blocking=True),
                self.eager_last_page_cpu,
                window_left=self._window_left,
                **self._plan_kwargs(),
            )
            self._plan_wide(fb.req_slots_np, seq_lens_np)
        self.forward_metadata = WindowMetadata(local_wrapper=self.eager_local)

    # ------------------------------------------------------------------ graphs
    def init_forward_metadata_capture_cuda_graph(self, bs, req_slots, req_slots_np, seq_lens, seq_lens_cpu) -> None:
        w = BatchDecodeWithPagedKVCacheWrapper(
            self.window_workspace,
            "NHD",
            use_cuda_graph=True,
            backend="fa2",
            paged_kv_indptr_buffer=self.win_kv_indptr[: bs + 1],
            paged_kv_indices_buffer=self.win_kv_indices,
            paged_kv_last_page_len_buffer=self.win_last_page_len[:bs],
        )
        self.decode_wrappers[bs] = w
        w.plan(
            torch.arange(bs + 1, dtype=torch.int32),
            self.win_kv_indices[:bs],
            torch.ones(bs, dtype=torch.int32),
            window_left=self._window_left,
            **self._plan_kwargs(),
        )
        self._plan_wide(req_slots_np, seq_lens_cpu.numpy())
        self.forward_metadata = WindowMetadata(local_wrapper=w)

    def init_forward_metadata_replay_cuda_graph(self, bs, req_slots, req_slots_np, seq_lens, seq_lens_cpu, raw_bs) -> None:
        ps = self.page_size
        first_page = [max(0, int(seq_lens[i]) - self.local_window) // ps for i in range(raw_bs)]  # expect: FC101
        first_np = np.zeros(bs, dtype=np.int32)
        first_np[:raw_bs] = first_page
        seq_lens_np = seq_lens_cpu.numpy()
        last_np = (np.maximum(seq_lens_np, 1) - 1) // ps
        indptr_np = self.win_kv_indptr_cpu.numpy()
        indptr_np[0] = 0
        np.cumsum(last_np - first_np + 1, out=indptr_np[1 : bs + 1])
        self.win_last_page_len_cpu.numpy()[:bs] = (np.maximum(seq_lens_np, 1) - 1) % ps + 1

        self.win_kv_indptr[: bs + 1].copy_(self.win_kv_indptr_cpu[: bs + 1], non_blocking=True)  # ok: FC104
        first_dev = torch.from_numpy(first_np).to(self.device, non_blocking=True)
        gather_window_pages[(bs,)](  # ok: FC104
            self.pool.ring_pages,
            req_slots,
            first_dev,
            self.win_kv_indptr,
            self.win_kv_indices,
            self.pool.ring_size,
            self.pool.ring_pages.stride(0),
            BLOCK=128,
        )
        w = self.decode_wrappers[bs]
        w.plan(
            self.win_kv_indptr_cpu[: bs + 1],
            self.win_kv_indices,
            self.win_last_page_len_cpu[:bs],
            window_left=self._window_left,
            **self._plan_kwargs(),
        )
        self._plan_wide(req_slots_np, seq_lens_np)
        self.forward_metadata = WindowMetadata(local_wrapper=w)

    # ------------------------------------------------------------------ forward
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, fb: ForwardBatch) -> torch.Tensor:
        if fb.forward_mode.is_decode():
            kv = self.pool.layer_cache(layer_id)
            if self.cfg.is_wide(layer_id):
                return self.wide_decode.run(q, kv)  # expect: FC108
            return self.forward_metadata.local_wrapper.run(q, kv)  # ok: FC108
        return self._forward_extend(q, k, v, layer_id, fb)

    def _forward_extend(self, q, k, v, layer_id: int, fb: ForwardBatch) -> torch.Tensor:
        window = self.wide_window if self.cfg.is_wide(layer_id) else self.local_window
        out = torch.empty_like(q)
        starts = fb.extend_start_loc_cpu.tolist()
        lens = fb.extend_seq_lens_cpu.tolist()
        for s, n in zip(starts, lens):
            out[s : s + n] = single_prefill_with_kv_cache(
                q[s : s + n], k[s : s + n], v[s : s + n], causal=True, window_left=window - 1
            )
        return out

    # ------------------------------------------------------------------ ring maintenance
    def recycle_pages(self, recycled: List[Tuple[int, int, int]], row_of_slot: Dict[int, int]) -> None:
        """A page that fell out of a request's ring was reused for its newest tokens.

        Patch the bound local-window indices of the last replayed batch in place, so that replaying the same batch
        again before the next plan reads the page's new role.
        """
        if not recycled:
            return
        pos, pages = [], []
        indptr = self.win_kv_indptr_cpu.numpy()
        for slot, entry, page in recycled:
            row = row_of_slot.get(slot)
            if row is None:
                continue
            start, end = int(indptr[row]), int(indptr[row + 1])
            pos.append(end - 1)
            pages.append(page)
        if pos:
            idx = torch.tensor(pos, dtype=torch.int64, device=self.device)
            self.win_kv_indices[idx] = torch.tensor(pages, dtype=torch.int32, device=self.device)  # expect: FC104
