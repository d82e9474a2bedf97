import logging
from typing import Dict, Tuple

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from beamserve import BEAM_GRAPH_WORKSPACE_BYTES
from beamserve.beam_state import BeamTable
from beamserve.config import BeamConfig

from .metadata import BeamDecodeMetadata

logger = logging.getLogger(__name__)


class BeamAttentionBackend:
    def __init__(self, cfg: BeamConfig, table: BeamTable, device: torch.device):
        self.cfg = cfg
        self.table = table
        self.device = device
        rows = cfg.max_rows
        self.float_workspace = torch.empty(cfg.decode_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
        self.graph_workspace = torch.empty(BEAM_GRAPH_WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        prefill_ws_bytes = cfg.prefill_workspace_bytes()
        self.prefill_workspace = torch.empty(prefill_ws_bytes, dtype=torch.uint8, device=device)  # ok: FC106
        self.trtllm_workspace = torch.empty(cfg.trtllm_workspace_bytes, dtype=torch.uint8, device=device)  # expect: FC105
        self.eager_wrappers: Dict[str, BatchDecodeWithPagedKVCacheWrapper] = {
            "narrow": BatchDecodeWithPagedKVCacheWrapper(self.float_workspace, "NHD", use_tensor_cores=True),
            "wide": BatchDecodeWithPagedKVCacheWrapper(self.float_workspace, "NHD", use_tensor_cores=True),
        }
        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, "NHD")
        self.kv_indptr_buf = torch.zeros(rows + 1, dtype=torch.int32, device=device)
        self.kv_indices_buf = torch.zeros(cfg.max_pages, dtype=torch.int32, device=device)
        self.kv_last_page_len_buf = torch.ones(rows, dtype=torch.int32, device=device)
        self.kv_last_page_len_device = torch.ones(rows, dtype=torch.int32, device=device)
        self.kv_indptr_cpu = torch.zeros(rows + 1, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_len_cpu = torch.ones(rows, dtype=torch.int32, pin_memory=True)
        self.parent_rows_buf = torch.zeros(rows, dtype=torch.int64, device=device)
        self.cum_logprobs = torch.zeros(rows, dtype=torch.float32, device=device)
        self.graph_wrappers: Dict[Tuple[int, int], BatchDecodeWithPagedKVCacheWrapper] = {}

    def init_graph_wrappers(self) -> None:
        self.kv_last_page_len_buf.fill_(1)  # ok: FC104
        for b in self.cfg.batch_buckets:
            for k in self.cfg.beam_buckets:
                rows = b * k
                self.graph_wrappers[(b, k)] = BatchDecodeWithPagedKVCacheWrapper(
                    self.graph_workspace,
                    "NHD",
                    use_cuda_graph=True,
                    use_tensor_cores=True,
                    paged_kv_indptr_buffer=self.kv_indptr_buf[: rows + 1],
                    paged_kv_indices_buffer=self.kv_indices_buf,
                    paged_kv_last_page_len_buffer=self.kv_last_page_len_buf[:rows],
                )

    def graph_buffers_in_use(self) -> Dict[Tuple[int, int], int]:
        return {key: w._paged_kv_indptr_buf.data_ptr() for key, w in self.graph_wrappers.items()}  # expect: FC103

    def _plan_args(self):
        c = self.cfg
        return dict(num_qo_heads=c.num_qo_heads, num_kv_heads=c.num_kv_heads, head_dim=c.head_dim, page_size=c.page_size)

    def init_forward_metadata(self, md: BeamDecodeMetadata) -> None:
        c = self.cfg
        if md.qo_indptr_host is not None:
            self.prefill_wrapper.plan(  # ok: FC102
                md.qo_indptr_host, md.kv_indptr_host, md.kv_indices, md.kv_last_page_len_host,
                c.num_qo_heads, c.num_kv_heads, c.head_dim, c.page_size, causal=True,
            )
            return
        if md.wide:
            self._plan_wide(md)
            return
        self.eager_wrappers["narrow"].plan(  # expect: FC102
            md.kv_indptr, md.kv_indices, md.kv_last_page_len_host,
            c.num_qo_heads, c.num_kv_heads, c.head_dim, c.page_size,
        )

    def _plan_wide(self, md: BeamDecodeMetadata) -> None:
        c = self.cfg
        self.kv_last_page_len_device[: md.rows].copy_(md.kv_last_page_len_host, non_blocking=True)
        plan = self.eager_wrappers["wide"].plan
        plan(md.kv_indptr_host, md.kv_indices, self.kv_last_page_len_device[: md.rows],  # expect: FC102
             c.num_qo_heads, c.num_kv_heads, c.head_dim, c.page_size)

    def init_forward_metadata_replay_cuda_graph(self, md: BeamDecodeMetadata, key: Tuple[int, int]) -> None:
        rows = md.rows
        padded = key[0] * key[1]
        alive = md.beam_scores > self.cfg.prune_threshold
        neg_inf = torch.full_like(md.beam_scores, float("-inf"))
        md.beam_scores = torch.where(alive, md.beam_scores, neg_inf)  # ok: FC101
        survivors = md.parent_rows[alive]  # expect: FC101
        self.parent_rows_buf[: survivors.shape[0]].copy_(survivors, non_blocking=True)
        if rows + 1 > self.table.max_width_host * md.batch + 1:
            raise ValueError(f"metadata rows {rows} exceed the table's widths")
        self.kv_indptr_cpu[: rows + 1].copy_(md.kv_indptr_host)
        self.kv_indptr_cpu[rows + 1 : padded + 1] = int(md.kv_indptr_host[-1])
        self.kv_last_page_len_cpu[:rows].copy_(md.kv_last_page_len_host)
        self.kv_indptr_buf[: padded + 1].copy_(self.kv_indptr_cpu[: padded + 1], non_blocking=True)  # ok: FC104
        n = md.kv_indices.shape[0]
        self.kv_indices_buf[:n].copy_(md.kv_indices, non_blocking=True)
        w = self.graph_wrappers[key]
        w.plan(self.kv_indptr_cpu[: padded + 1], self.kv_indices_buf, self.kv_last_page_len_cpu[:padded],  # ok: FC102
               **self._plan_args())
        self.kv_last_page_len_buf[rows:padded].fill_(1)  # expect: FC104

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, md: BeamDecodeMetadata) -> torch.Tensor:
        if md.wide:
            return self._forward_wide(q, kv_cache)
        w = self.graph_wrappers[md.graph_key] if md.graph_key is not None else self.eager_wrappers["narrow"]
        return w.run(q, kv_cache)  # ok: FC108

    def _forward_wide(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return self.eager_wrappers["wide"].run(q, kv_cache)  # expect: FC108

    def forward_long(self, q, kv_cache, block_tables, seq_lens_host: np.ndarray) -> torch.Tensor:
        seq_lens = torch.from_numpy(seq_lens_host).to(self.device, non_blocking=True)
        return trtllm_batch_decode_with_kv_cache(
            query=q,
            kv_cache=kv_cache,
            workspace_buffer=self.trtllm_workspace,
            block_tables=block_tables,
            seq_lens=seq_lens,
            max_seq_len=self.cfg.max_context,
        )
