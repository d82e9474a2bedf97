"""FlashInfer MLA wrappers, one set per GPU: a graph-mode decode wrapper planned from pinned host mirrors
before every replay, and eager wrappers for prefill chunks and the MTP (nextn) draft layer."""
from __future__ import annotations

from typing import ClassVar, Dict, Optional, Tuple

import torch
from flashinfer.mla import BatchMLAPagedAttentionWrapper

PREFILL_WORKSPACE_BYTES = 256 * 1024 * 1024  # scratch of the eager chunked-prefill wrapper


def decode_workspace_bytes(max_batch_size: int, num_heads: int, kv_lora_rank: int) -> int:
    # split-k partial outputs (fp32) plus one LSE per head, up to 16 KV chunks per request
    per_request = num_heads * (kv_lora_rank + 1) * 4 * 16
    return max(64 << 20, max_batch_size * per_request)


class MLAWrapper:
    def __init__(self, max_batch_size, max_pages, page_size, num_heads, kv_lora_rank, max_seq_len, device):
        assert page_size in (16, 32, 64), f"unsupported page size {page_size}"  # expect: FC109
        self.device, self.max_batch_size, self.page_size, self.max_seq_len = device, max_batch_size, page_size, max_seq_len
        ws_bytes = decode_workspace_bytes(max_batch_size, num_heads, kv_lora_rank)
        self.workspace = torch.empty(ws_bytes, dtype=torch.uint8, device=device)  # ok: FC106
        # Blackwell decode goes through the trtllm-gen MLA kernel, which keeps split-k counters here.
        self.trtllm_workspace = torch.empty(ws_bytes, dtype=torch.uint8, device=device)  # expect: FC105
        self.prefill_workspace = torch.empty(PREFILL_WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.nextn_workspace = torch.empty(ws_bytes // 4, dtype=torch.uint8, device=device)  # ok: FC105
        self.qo_indptr_buf = torch.arange(0, max_batch_size + 1, dtype=torch.int32, device=device)
        self.kv_indptr_buf = torch.zeros(max_batch_size + 1, dtype=torch.int32, device=device)
        self.kv_indices_buf = torch.zeros(max_pages, dtype=torch.int32, device=device)
        self.kv_len_arr_buf = torch.zeros(max_batch_size, dtype=torch.int32, device=device)
        self.block_tables = torch.zeros(max_batch_size, max_seq_len // page_size, dtype=torch.int32, device=device)
        self.qo_indptr_host = torch.arange(0, max_batch_size + 1, dtype=torch.int32).pin_memory()
        self.kv_indptr_host = torch.zeros(max_batch_size + 1, dtype=torch.int32, pin_memory=True)
        self.kv_len_arr_host = torch.zeros(max_batch_size, dtype=torch.int32, pin_memory=True)  # plan() reads the mirrors
        self.wrapper = BatchMLAPagedAttentionWrapper(
            self.workspace, use_cuda_graph=True, qo_indptr=self.qo_indptr_buf, kv_indptr=self.kv_indptr_buf,
            kv_indices=self.kv_indices_buf, kv_len_arr=self.kv_len_arr_buf)
        self.prefill_wrapper = BatchMLAPagedAttentionWrapper(self.prefill_workspace)
        self.nextn_wrapper = BatchMLAPagedAttentionWrapper(self.nextn_workspace)
        self._plan_info: Optional[Tuple[int, int]] = None

    def plan(self, batch_size, kv_lens_host, page_ids, num_heads, head_dim_ckv, head_dim_kpe, sm_scale, q_dtype, kv_dtype):
        if batch_size > self.max_batch_size:
            raise ValueError(f"decode batch {batch_size} exceeds the captured maximum {self.max_batch_size}")
        bs = batch_size
        pages = (kv_lens_host[:bs] + self.page_size - 1) // self.page_size
        self.kv_indptr_host[0] = 0
        torch.cumsum(pages, 0, out=self.kv_indptr_host[1 : bs + 1])
        self.kv_len_arr_host[:bs].copy_(kv_lens_host[:bs])
        num_pages = int(self.kv_indptr_host[bs])  # ok: FC101
        self.kv_indices_buf[:num_pages].copy_(page_ids[:num_pages], non_blocking=True)  # ok: FC104
        self.wrapper.plan(  # ok: FC102
            self.qo_indptr_host[: bs + 1], self.kv_indptr_host[: bs + 1], self.kv_indices_buf[:num_pages],
            self.kv_len_arr_host[:bs], num_heads, head_dim_ckv, head_dim_kpe, self.page_size,
            False, sm_scale, q_dtype, kv_dtype)
        self._plan_info = (bs, num_pages)
        self.kv_len_arr_host[bs:].zero_()  # ok: FC104
        # padded graph rows must see an empty KV range
        self.kv_indptr_buf[bs + 1 :].fill_(num_pages)  # expect: FC104

    def plan_nextn(self, num_heads, head_dim_ckv, head_dim_kpe, sm_scale, q_dtype, kv_dtype) -> None:
        # the MTP draft token attends to one more position than the target's last token
        bs, num_pages = self._plan_info  # ok: FC103
        self.nextn_wrapper.plan(  # expect: FC102
            self.qo_indptr_host[: bs + 1], self.kv_indptr_host[: bs + 1], self.kv_indices_buf[:num_pages],
            self.kv_len_arr_buf[:bs] + 1, num_heads, head_dim_ckv, head_dim_kpe, self.page_size,
            False, sm_scale, q_dtype, kv_dtype)

    def plan_prefill(self, q_lens_host, kv_lens_host, page_ids, num_heads, head_dim_ckv, head_dim_kpe,
                     sm_scale, q_dtype, kv_dtype):
        n = q_lens_host.numel()
        # the rope kernel wants qo_indptr on the device too, so it is built there
        qo_indptr = torch.zeros(n + 1, dtype=torch.int32, device=self.device)
        qo_indptr[1:] = torch.cumsum(q_lens_host.to(self.device, non_blocking=True), 0)
        kv_indptr_host = torch.zeros(n + 1, dtype=torch.int32)
        torch.cumsum((kv_lens_host + self.page_size - 1) // self.page_size, 0, out=kv_indptr_host[1:])
        self.prefill_wrapper.plan(  # expect: FC102
            qo_indptr, kv_indptr_host, page_ids, kv_lens_host, num_heads, head_dim_ckv, head_dim_kpe,
            self.page_size, True, sm_scale, q_dtype, kv_dtype)
        return qo_indptr


class MLAWrapperSingleton:
    """Class-level registry: one ``MLAWrapper`` per device, created on first use."""
    _instances: ClassVar[Dict[torch.device, MLAWrapper]] = {}

    @classmethod
    def get_instance(cls, device: torch.device, cfg) -> MLAWrapper:
        if device not in cls._instances:
            cls._instances[device] = MLAWrapper(cfg.max_decode_batch, cfg.max_pages, cfg.page_size, cfg.num_heads,
                                                cfg.kv_lora_rank, cfg.max_seq_len, device)
        return cls._instances[device]

    @classmethod
    def plan_all(cls, batch_size: int, kv_lens_host: torch.Tensor, page_ids: torch.Tensor, **plan_kw) -> None:
        if int(kv_lens_host[:batch_size].sum()) == 0:  # ok: FC101
            raise ValueError("decode batch without cached tokens")
        for device, inst in cls._instances.items():
            inst.plan(batch_size, kv_lens_host, page_ids.to(device, non_blocking=True), **plan_kw)

    @classmethod
    def workspace_bytes(cls) -> int:
        total = 0
        for inst in cls._instances.values():
            total += inst.workspace.numel() + inst.prefill_workspace.numel()
            total += inst.wrapper._int_workspace_buffer.numel()  # expect: FC103
        return total
