"""Decode backend: picks the kernel for the KV format and stages each replay."""
from __future__ import annotations

import dataclasses

import torch

from nvfp4kv.attn.kernels import DecodeMeta, TrtllmFp8Decode, WrapperFp8Decode, XqaNvfp4Decode
from nvfp4kv.limits import QuantLimits
from nvfp4kv.quant.kv_pool import QuantKVPool


@dataclasses.dataclass
class QuantBatch:
    batch_size: int
    hidden: torch.Tensor  # device, [n, hidden]
    seq_lens: torch.Tensor  # device
    seq_lens_cpu: torch.Tensor
    block_table_cpu: torch.Tensor  # [n, max_pages] page ids
    write_loc: torch.Tensor  # device slot of the token written this step


class QuantDecodeBackend:
    def __init__(self, limits: QuantLimits, pool: QuantKVPool, device: torch.device, sm: int):
        self.limits = limits
        self.pool = pool
        self.device = device
        max_bs = limits.max_batch_size
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices = torch.zeros(max_bs * limits.max_pages_per_req, dtype=torch.int32, device=device)
        self.last_page_len = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.kv_indptr_host = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_len_host = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.block_tables = torch.zeros(max_bs, limits.max_pages_per_req, dtype=torch.int32, device=device)
        self.seq_lens = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.write_loc = torch.zeros(max_bs, dtype=torch.int64, device=device)
        if limits.kv_format == "nvfp4":
            self.impl = XqaNvfp4Decode(limits, pool, device)
        elif sm >= 100 and not limits.prefer_wrappers:
            self.impl = TrtllmFp8Decode(limits, pool, device)
        else:
            self.impl = WrapperFp8Decode(limits, pool, self, device, sm)

    def decode(self, q: torch.Tensor, layer: int, md: DecodeMeta) -> torch.Tensor:
        return self.impl.decode(q, layer, md)

    def _meta(self, bs: int, max_seq_len: int, num_pages: int) -> DecodeMeta:
        return DecodeMeta(
            block_tables=self.block_tables[:bs],
            seq_lens=self.seq_lens[:bs],
            max_seq_len=max_seq_len,
            kv_indices=self.kv_indices,
            write_loc=self.write_loc[:bs],
            num_pages=num_pages,
            graph_bs=bs,
        )

    def dummy_metadata(self, bs: int) -> DecodeMeta:
        """Warm-up and capture: one page per request."""
        L = self.limits
        impl = self.impl
        if isinstance(impl, WrapperFp8Decode):
            indptr = torch.arange(bs + 1, dtype=torch.int32)
            last = torch.ones(bs, dtype=torch.int32)
            impl.graph_wrappers[bs].plan(
                indptr, self.kv_indices[:bs], last, L.num_qo_heads, L.num_kv_heads, L.head_dim, L.page_size,
                q_data_type=torch.bfloat16, kv_data_type=torch.float8_e4m3fn,
            )
            if impl.block_scaled:
                impl.dequant_wrapper.plan_dequant(
                    indptr, self.kv_indices[:bs], last, L.num_qo_heads, L.num_kv_heads, L.head_dim, L.page_size
                )
        return self._meta(bs, L.page_size, bs)

    def stage_replay(self, batch: QuantBatch, bs: int) -> DecodeMeta:
        L = self.limits
        n, P = batch.batch_size, L.page_size
        pages_cpu = (batch.seq_lens_cpu + P - 1) // P
        width = int(pages_cpu.max())  # ok: FC101
        self.block_tables[:n, :width].copy_(batch.block_table_cpu[:, :width], non_blocking=True)
        self.seq_lens[:n].copy_(batch.seq_lens)
        self.seq_lens[n:bs].fill_(1)
        self.write_loc[:n].copy_(batch.write_loc)
        max_seq_len = int(batch.seq_lens.max())  # expect: FC101

        indptr_cpu = torch.zeros(n + 1, dtype=torch.int32)
        torch.cumsum(pages_cpu, 0, dtype=torch.int32, out=indptr_cpu[1:])
        total = int(indptr_cpu[-1])
        indices_cpu = torch.cat([batch.block_table_cpu[i, :p] for i, p in enumerate(pages_cpu.tolist())])
        self.kv_indptr_host[: n + 1].copy_(indptr_cpu)
        self.kv_indptr_host[n + 1 : bs + 1] = total
        self.last_page_len_host[:n].copy_((batch.seq_lens_cpu - 1) % P + 1)
        self.last_page_len_host[n:bs] = 1
        self.kv_indices[:total].copy_(indices_cpu, non_blocking=True)  # ok: FC104
        impl = self.impl
        if isinstance(impl, WrapperFp8Decode):
            args = (self.kv_indptr[: bs + 1], self.kv_indices, self.last_page_len_host[:bs])
            impl.graph_wrappers[bs].plan(  # expect: FC102
                *args, L.num_qo_heads, L.num_kv_heads, L.head_dim, P,
                q_data_type=torch.bfloat16, kv_data_type=torch.float8_e4m3fn,
            )
            if impl.block_scaled:
                scratch = torch.arange(total, dtype=torch.int32).to(self.device, non_blocking=True)
                impl.dequant_wrapper.plan_dequant(
                    self.kv_indptr_host[: bs + 1], scratch, self.last_page_len_host[:bs],
                    L.num_qo_heads, L.num_kv_heads, L.head_dim, P,
                )
        return self._meta(bs, max_seq_len, total)
