"""FlashInfer backend over the elastic pool."""

from __future__ import annotations

from typing import Dict

import flashinfer
import torch

from elastic.batch import ForwardBatch
from elastic.config import ElasticConfig, WorkspaceSize
from elastic.pool import ElasticKVPool
from elastic.ws import eager_decode_workspace, make_workspace

Decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper


class ElasticAttnBackend:
    def __init__(self, cfg: ElasticConfig, pool: ElasticKVPool, device: torch.device):
        self.cfg = cfg
        self.pool = pool
        self.device = device
        if self.pool._kv_layout != "NHD":  # ok: FC103
            raise ValueError("the elastic backend assumes NHD pages")
        n, p = cfg.max_batch, cfg.max_batch * cfg.max_pages_per_req
        i32 = torch.int32
        self.kv_indptr = torch.zeros(n + 1, dtype=i32, device=device)
        self.kv_indices = torch.zeros(p, dtype=i32, device=device)
        self.kv_last_len = torch.ones(n, dtype=i32, device=device)
        self.kv_indptr_host = torch.zeros(n + 1, dtype=i32, pin_memory=True)
        self.kv_last_len_host = torch.ones(n, dtype=i32, pin_memory=True)
        self.graph_bufs = {"indptr": self.kv_indptr, "indices": self.kv_indices, "last_len": self.kv_last_len}
        self.init_cuda_graph_state()

        self.graph_workspace = torch.zeros(WorkspaceSize.GRAPH.nbytes(), dtype=torch.uint8, device=device)  # expect: FC106
        self.decode_wrappers: Dict[int, Decode] = {}
        kw = {"backend": "trtllm-gen"}
        self.eager_decode = Decode(
            eager_decode_workspace(cfg.eager_workspace_bytes(), device.index or 0), "NHD", **kw
        )
        # FA2 decode used while the pool is being resized
        resize_workspace = torch.zeros(cfg.decode_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC106
        self.resize_decode = Decode(resize_workspace, "NHD")
        self.prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
            make_workspace(cfg.prefill_workspace_bytes(), device, zeroed=True), "NHD", backend="trtllm-gen"
        )

    def _plan_kwargs(self) -> dict:
        c = self.cfg
        return dict(num_qo_heads=c.num_qo_heads, num_kv_heads=c.num_kv_heads, head_dim=c.head_dim,
                    page_size=c.page_size, q_data_type=torch.bfloat16)

    # ---- set-up -----------------------------------------------------------------

    def init_cuda_graph_state(self) -> None:
        self.kv_indptr.zero_()  # ok: FC104
        self.kv_last_len.fill_(1)

    def make_graph_wrapper(self, bs: int) -> Decode:
        return Decode(
            self.graph_workspace,
            "NHD",
            use_cuda_graph=True,
            use_tensor_cores=True,
            paged_kv_indptr_buffer=self.kv_indptr[: bs + 1],
            paged_kv_indices_buffer=self.kv_indices,
            paged_kv_last_page_len_buffer=self.kv_last_len[:bs],
        )

    # ---- per step ---------------------------------------------------------------

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        max_len = int(batch.seq_lens_cpu.max())  # ok: FC101
        if max_len > self.cfg.max_context:
            raise ValueError(f"row of {max_len} tokens exceeds max_context={self.cfg.max_context}")
        self.pool.lookup_remap(batch.kv_indices)
        c = self.cfg
        if batch.num_prefill:
            self.prefill.plan(  # expect: FC102
                batch.qo_indptr_cpu,
                batch.kv_indptr_cpu,
                batch.kv_indices_cpu,
                batch.last_page_len,
                c.num_qo_heads,
                c.num_kv_heads,
                c.head_dim,
                c.page_size,
                causal=True,
                q_data_type=torch.bfloat16,
            )
        elif batch.batch_size not in self.decode_wrappers:
            self.plan_eager(batch)

    def plan_eager(self, batch: ForwardBatch) -> None:
        self.eager_decode.plan(
            batch.kv_indptr_cpu, batch.kv_indices_cpu, batch.last_page_len_cpu, **self._plan_kwargs()
        )

    def init_forward_metadata_replay_cuda_graph(self, bs: int, batch: ForwardBatch) -> None:
        real = batch.batch_size
        self.kv_indptr_host[: real + 1].copy_(batch.kv_indptr_cpu)
        nnz = int(self.kv_indptr_host[real])
        self.kv_indptr_host[real + 1 : bs + 1] = nnz
        self.kv_last_len_host[:real].copy_(batch.last_page_len_cpu)
        self.kv_last_len_host[real:bs] = 1
        self.kv_last_len[:bs].copy_(self.kv_last_len_host[:bs], non_blocking=True)  # ok: FC104
        self.decode_wrappers[bs].plan(  # ok: FC102
            self.kv_indptr_host[: bs + 1],
            batch.kv_indices_cpu,
            self.kv_last_len_host[:bs],
            **self._plan_kwargs(),
        )
        # device indptr for the KV-append kernel of the live rows
        torch.cumsum(batch.pages_per_row, 0, dtype=torch.int32, out=self.kv_indptr[1 : real + 1])  # expect: FC104

    def init_forward_metadata_capture_cuda_graph(self, bs: int) -> None:
        self.kv_indptr_host[: bs + 1].copy_(torch.arange(bs + 1, dtype=torch.int32))
        self.kv_last_len_host[:bs].fill_(1)
        self.decode_wrappers[bs].plan(
            self.kv_indptr_host[: bs + 1], torch.zeros(bs, dtype=torch.int32), self.kv_last_len_host[:bs],
            **self._plan_kwargs(),
        )

    # ---- attention --------------------------------------------------------------

    def forward_decode(self, q: torch.Tensor, kv: torch.Tensor, bs: int) -> torch.Tensor:
        if self.pool.resizing:
            return self.resize_decode.run(q, kv)  # expect: FC108
        w = self.decode_wrappers.get(bs) or self.eager_decode
        return w.run(q, kv)  # ok: FC108

    def forward_prefill(self, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        return self.prefill.run(q, kv)
