"""FlashInfer attention over two alternating buffer sets."""

from __future__ import annotations

import dataclasses
import functools
from typing import Dict, List

import flashinfer
import torch

from db_attn.workspaces import (
    get_graph_workspace,
    get_long_decode_workspace,
    get_prefill_workspace,
    get_short_decode_workspace,
)
from db_runtime.builder import StepInputs
from dbuf.buffers import BufferSet, make_buffer_set
from dbuf.config import DoubleBufferConfig

DecodeWrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper


@dataclasses.dataclass
class DecodeContext:
    slot: int
    bs: int
    graph: bool = True
    long_rows: bool = False


class DoubleBufferAttnBackend:
    def __init__(self, cfg: DoubleBufferConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.buffer_sets: List[BufferSet] = [make_buffer_set(cfg, device, s) for s in range(2)]
        self.init_buffer_sets()
        self.graph_workspaces = [get_graph_workspace(cfg, device) for _ in range(2)]
        self.graph_wrappers: List[Dict[int, DecodeWrapper]] = [{}, {}]

        self.prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
            get_prefill_workspace(cfg, device), "NHD", backend="fa2"
        )
        self.decode_backends = {"long": "trtllm-gen", "short": "fa2"}
        self.long_decode = DecodeWrapper(
            get_long_decode_workspace(cfg, device), "NHD", backend=self.decode_backends["long"]
        )
        self.short_decode = DecodeWrapper(
            get_short_decode_workspace(cfg, device),
            "NHD",
            use_tensor_cores=cfg.group_size >= 4,
            backend=self.decode_backends["short"],
        )
        self._short_plan = functools.partial(
            self.short_decode.plan,
            num_qo_heads=cfg.num_qo_heads,
            num_kv_heads=cfg.num_kv_heads,
            head_dim=cfg.head_dim,
            page_size=cfg.page_size,
            q_data_type=torch.bfloat16,
        )

    # ---- set-up -----------------------------------------------------------------

    def init_buffer_sets(self) -> None:
        for bufs in self.buffer_sets:
            bufs.indptr.zero_()  # ok: FC104
            bufs.last_len.fill_(1)

    def init_graph_wrappers(self) -> None:
        assert len(self.buffer_sets) == 2, "double buffering needs exactly two sets"  # ok: FC109
        for slot, bufs in enumerate(self.buffer_sets):
            for bs in self.cfg.buckets:
                self.graph_wrappers[slot][bs] = DecodeWrapper(
                    self.graph_workspaces[slot],
                    "NHD",
                    use_cuda_graph=True,
                    use_tensor_cores=self.cfg.group_size >= 4,
                    paged_kv_indptr_buffer=bufs.indptr[: bs + 1],
                    paged_kv_indices_buffer=bufs.indices,
                    paged_kv_last_page_len_buffer=bufs.last_len[:bs],
                )

    def _decode_plan_kwargs(self) -> dict:
        c = self.cfg
        return dict(
            num_qo_heads=c.num_qo_heads,
            num_kv_heads=c.num_kv_heads,
            head_dim=c.head_dim,
            page_size=c.page_size,
            q_data_type=torch.bfloat16,
        )

    # ---- per step ---------------------------------------------------------------

    def plan_prefill(self, batch: StepInputs) -> None:
        c = self.cfg
        self.prefill.plan(  # expect: FC102
            batch.qo_indptr,
            batch.kv_indptr_host,
            batch.kv_indices_host,
            batch.last_len_host,
            c.num_qo_heads,
            c.num_kv_heads,
            c.head_dim,
            c.page_size,
            causal=True,
            q_data_type=torch.bfloat16,
        )

    def plan_long_decode(self, batch: StepInputs) -> None:
        self.long_decode.plan(  # ok: FC102
            batch.kv_indptr_host,
            batch.kv_indices_host,
            batch.last_len_host,
            **self._decode_plan_kwargs(),
        )

    def plan_short_decode(self, batch: StepInputs) -> None:
        # the device copy of the last-page lengths is already there for the
        # KV-append kernel, so hand that one over
        self._short_plan(batch.kv_indptr_host, batch.kv_indices_host, batch.last_len)  # expect: FC102

    def prepare_replay(self, slot: int, bs: int, real_bs: int) -> None:
        """Plan the staged set ``slot`` for bucket ``bs`` (``real_bs`` live rows)."""
        bufs = self.buffer_sets[slot]
        nnz = int(bufs.indptr_host[real_bs])  # ok: FC101
        # padding rows are empty and have a last page of length 1
        bufs.indptr_host[real_bs + 1 : bs + 1] = nnz
        bufs.last_len_host[real_bs:bs] = 1
        bufs.indptr[: bs + 1].copy_(bufs.indptr_host[: bs + 1], non_blocking=True)  # ok: FC104
        w = self.graph_wrappers[slot][bs]
        w.plan(  # ok: FC102
            bufs.indptr_host[: bs + 1],
            bufs.indices_host[:nnz],
            bufs.last_len_host[:bs],
            **self._decode_plan_kwargs(),
        )
        bufs.last_len[real_bs:bs].fill_(1)  # expect: FC104

    def init_forward_metadata_capture_cuda_graph(self, slot: int, bs: int) -> None:
        bufs = self.buffer_sets[slot]
        bufs.indptr_host[: bs + 1].copy_(torch.arange(bs + 1, dtype=torch.int32))
        bufs.indices_host[:bs].zero_()
        bufs.last_len_host[:bs].fill_(1)
        self.graph_wrappers[slot][bs].plan(
            bufs.indptr_host[: bs + 1],
            bufs.indices_host[:bs],
            bufs.last_len_host[:bs],
            **self._decode_plan_kwargs(),
        )

    # ---- attention --------------------------------------------------------------

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, ctx: DecodeContext) -> torch.Tensor:
        if ctx.long_rows:
            return self.long_decode.run(q, kv_cache)  # expect: FC108
        w = self.graph_wrappers[ctx.slot].get(ctx.bs) if ctx.graph else self.short_decode
        return w.run(q, kv_cache)  # ok: FC108

    def forward_prefill(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return self.prefill.run(q, kv_cache)
