"""Attention of one replica: decode wrappers per bucket in graph mode, eager and reference decodes, a prefill."""

from dataclasses import dataclass
from typing import Dict

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper

from rep_attn.workspace import eager_workspace, graph_workspace, prefill_workspace, verify_workspace
from standby.config import ReplicaConfig
from standby.pages import max_pages


@dataclass
class StepMeta:
    num_rows: int
    input_ids: torch.Tensor  # on the device
    seq_lens: torch.Tensor  # on the device: the rotary positions read it
    kv_indptr: torch.Tensor  # device copy of the indptr
    kv_indptr_host: torch.Tensor  # pinned
    kv_indices: torch.Tensor  # on the device
    last_page_len_host: torch.Tensor  # pinned


@dataclass
class PrefillMeta:
    qo_indptr_host: torch.Tensor
    kv_indptr_host: torch.Tensor
    kv_indices: torch.Tensor
    last_page_len_host: torch.Tensor


class ReplicaBackend:
    def __init__(self, cfg: ReplicaConfig, device: torch.device, role: str):
        self.cfg = cfg
        self.device = device
        self.role = role
        self.verify_mirror = cfg.verify_mirror and role == "standby"
        max_bs = cfg.decode_buckets[-1]
        self.kv_indptr_buf = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices_buf = torch.zeros(cfg.max_pages, dtype=torch.int32, device=device)
        self.last_page_len_buf = torch.empty(max_bs, dtype=torch.int32, device=device)
        self.seq_lens_buf = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.graph_ws = graph_workspace(device)
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.eager_decode = BatchDecodeWithPagedKVCacheWrapper(eager_workspace(cfg, device), "HND")
        # reference decode over the mirrored pages, compared with the bucket's output
        self.verify_decode = BatchDecodeWithPagedKVCacheWrapper(verify_workspace(cfg, device), "HND")
        self.prefill = BatchPrefillWithPagedKVCacheWrapper(prefill_workspace(cfg, device), "HND")
        self.mirror_err = torch.zeros((), dtype=torch.float32, device=device)
        self.active_bs = -1
        self.last_rows = 0
        self.last_num_indices = 0
        self.max_pages_in_batch = 0

    def init_graph_wrappers(self) -> None:
        for bs in self.cfg.decode_buckets:
            self.graph_wrappers[bs] = BatchDecodeWithPagedKVCacheWrapper(
                self.graph_ws,
                "HND",
                use_cuda_graph=True,
                paged_kv_indptr_buffer=self.kv_indptr_buf[: bs + 1],
                paged_kv_indices_buffer=self.kv_indices_buf,
                paged_kv_last_page_len_buffer=self.last_page_len_buf[:bs],
            )
        self.last_page_len_buf.fill_(1)  # ok: FC104

    def dummy_meta(self, bs: int) -> StepMeta:
        indptr = torch.arange(bs + 1, dtype=torch.int32)
        return StepMeta(
            num_rows=bs,
            input_ids=torch.zeros(bs, dtype=torch.int64, device=self.device),
            seq_lens=torch.ones(bs, dtype=torch.int32, device=self.device),
            kv_indptr=indptr.to(self.device),
            kv_indptr_host=indptr,
            kv_indices=torch.zeros(bs, dtype=torch.int32, device=self.device),
            last_page_len_host=torch.ones(bs, dtype=torch.int32),
        )

    def prepare_bucket(self, bs: int, meta: StepMeta) -> None:
        n = meta.kv_indices.numel()
        self.max_pages_in_batch = max_pages(meta.seq_lens, self.cfg.page_size)
        self.kv_indices_buf[:n].copy_(meta.kv_indices, non_blocking=True)  # ok: FC104
        self.seq_lens_buf = meta.seq_lens.clone()  # expect: FC107
        kw = dict(
            indptr=meta.kv_indptr,
            indices=self.kv_indices_buf[:n],
            last_page_len=meta.last_page_len_host,
            num_qo_heads=self.cfg.num_qo_heads,
            num_kv_heads=self.cfg.num_kv_heads,
            head_dim=self.cfg.head_dim,
            page_size=self.cfg.page_size,
            q_data_type=torch.bfloat16,
        )
        w = self.graph_wrappers[bs]
        w.plan(**kw)  # expect: FC102
        if self.verify_mirror:
            self.verify_decode.plan(
                meta.kv_indptr_host, meta.kv_indices, meta.last_page_len_host,
                self.cfg.num_qo_heads, self.cfg.num_kv_heads, self.cfg.head_dim, self.cfg.page_size,
            )
        # padding rows of the bucket: empty KV ranges
        self.kv_indptr_buf[meta.num_rows + 1 : bs + 1] = self.kv_indptr_buf[meta.num_rows]  # expect: FC104
        self.active_bs = bs
        self.last_rows = meta.num_rows
        self.last_num_indices = n

    def plan_eager(self, meta: StepMeta) -> None:
        self.eager_decode.plan(
            meta.kv_indptr_host, meta.kv_indices, meta.last_page_len_host,
            self.cfg.num_qo_heads, self.cfg.num_kv_heads, self.cfg.head_dim, self.cfg.page_size,
        )
        self.seq_lens_buf[: meta.num_rows].copy_(meta.seq_lens, non_blocking=True)
        self.active_bs = -1
        self.last_rows = meta.num_rows

    def plan_prefill(self, meta: PrefillMeta) -> None:
        self.prefill.plan(  # ok: FC102
            meta.qo_indptr_host,
            meta.kv_indptr_host,
            meta.kv_indices,
            meta.last_page_len_host,
            self.cfg.num_qo_heads,
            self.cfg.num_kv_heads,
            self.cfg.head_dim,
            self.cfg.page_size,
            causal=True,
        )

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, layer_id: int) -> torch.Tensor:
        bs = self.active_bs
        if bs in self.graph_wrappers:
            w = self.graph_wrappers[bs]
        else:
            w = self.eager_decode
        out = w.run(q, kv_cache[layer_id])  # ok: FC108
        if self.verify_mirror and layer_id == 0:
            ref = self.verify_decode.run(q, kv_cache[layer_id])  # expect: FC108
            torch.maximum(self.mirror_err, (ref - out).abs().amax().float(), out=self.mirror_err)
        return out

    def forward_prefill(self, q: torch.Tensor, kv_cache: torch.Tensor, layer_id: int) -> torch.Tensor:
        return self.prefill.run(q, kv_cache[layer_id])
