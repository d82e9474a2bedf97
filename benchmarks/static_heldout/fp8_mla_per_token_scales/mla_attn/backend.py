"""MLA decode over the FP8 latent cache: trtllm-gen (or FA2 MLA graphs per bucket) for decode,
an eager FA2 MLA wrapper for speculative verification, an FA2 ragged prefill."""
from __future__ import annotations

import functools
from typing import Dict, Optional

import torch
from flashinfer import BatchPrefillWithRaggedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache_mla
from flashinfer.mla import BatchMLAPagedAttentionWrapper

from mla_fp8 import LatentCache, MLAConfig
from mla_attn.meta import MLADecodeMeta
from mla_attn.workspace import fa2_prefill_workspace, get_trtllm_mla_workspace


class FP8MLABackend:
    GRAPH_WS_BYTES = 384 * 1024 * 1024

    def __init__(self, cfg: MLAConfig, device: torch.device) -> None:
        self.cfg, self.device = cfg, device
        self._backend = cfg.decode_impl  # ok: FC103
        self.trtllm_workspace = get_trtllm_mla_workspace(cfg.trtllm_workspace_bytes(), device)
        self.graph_workspace = torch.zeros(self.GRAPH_WS_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.prefill_workspace = fa2_prefill_workspace(cfg.prefill_workspace_bytes(), device)
        self.verify_workspace = torch.zeros(cfg.prefill_workspace_bytes(), dtype=torch.uint8, device=device)
        self.prefill = BatchPrefillWithRaggedKVCacheWrapper(self.prefill_workspace, "NHD", backend="fa2")
        self.verify = BatchMLAPagedAttentionWrapper(self.verify_workspace, backend="fa2")
        self.graph_mla: Dict[int, BatchMLAPagedAttentionWrapper] = {}
        self.meta: Optional[MLADecodeMeta] = None
        self.max_seq_len = cfg.page_size
        self.init_decode_buffers()

    def init_decode_buffers(self) -> None:
        b, p, dev = self.cfg.max_graph_bs, self.cfg.max_pages_per_seq, self.device
        self.qo_indptr_buf = torch.arange(b + 1, dtype=torch.int32, device=dev)
        self.kv_indptr_buf = torch.zeros(b + 1, dtype=torch.int32, device=dev)
        self.kv_indices_buf = torch.zeros(b * p, dtype=torch.int32, device=dev)
        self.kv_len_buf = torch.empty(b, dtype=torch.int32, device=dev)
        self.kv_len_buf.fill_(1)  # ok: FC104
        self.block_table_buf = torch.zeros(b, p, dtype=torch.int32, device=dev)
        self.seq_lens_buf = torch.ones(b, dtype=torch.int32, device=dev)
        self.qo_indptr_cpu = torch.arange(b + 1, dtype=torch.int32).pin_memory()
        self.kv_indptr_cpu = torch.zeros(b + 1, dtype=torch.int32, pin_memory=True)
        self.kv_len_cpu = torch.ones(b, dtype=torch.int32, pin_memory=True)
        self.seq_lens_host = torch.ones(b, dtype=torch.int32)

    def _plan_kwargs(self, causal: bool = False) -> dict:
        c = self.cfg
        return dict(
            num_heads=c.num_heads, head_dim_ckv=c.kv_lora_rank, head_dim_kpe=c.qk_rope_head_dim,
            page_size=c.page_size, causal=causal, sm_scale=c.softmax_scale,
            q_data_type=torch.bfloat16, kv_data_type=torch.float8_e4m3fn,
        )

    def capture_decode(self, bs: int, q_len: int) -> None:
        if self._backend == "fa2" and bs not in self.graph_mla:
            w = BatchMLAPagedAttentionWrapper(
                self.graph_workspace, use_cuda_graph=True, backend="fa2",
                qo_indptr=self.qo_indptr_buf[: bs + 1], kv_indptr=self.kv_indptr_buf[: bs + 1],
                kv_indices=self.kv_indices_buf, kv_len_arr=self.kv_len_buf[:bs],
            )
            self.kv_indptr_cpu[: bs + 1] = torch.arange(bs + 1, dtype=torch.int32)
            w.plan(  # ok: FC102
                self.qo_indptr_cpu[: bs + 1], self.kv_indptr_cpu[: bs + 1], self.kv_indices_buf,
                self.kv_len_cpu[:bs], **self._plan_kwargs(),
            )
            self.graph_mla[bs] = w
        self.meta = MLADecodeMeta(
            bs, q_len, self.kv_indptr_cpu[: bs + 1], self.kv_indices_buf, self.kv_len_cpu[:bs],
            self.seq_lens_buf[:bs], self.block_table_buf[:bs],
        )
        if q_len > 1:  # MTP verification graphs
            self.plan_verify(self.meta)

    def prepare_decode(self, meta: MLADecodeMeta, bs: int) -> None:
        self.meta = meta
        n = meta.num_seqs
        self.max_seq_len = int(meta.seq_lens.max())  # expect: FC101
        self.seq_lens_host = meta.seq_lens_cpu.clone()  # ok: FC107
        if self._backend == "trtllm-gen":
            self.seq_lens_buf = meta.seq_lens.clone()  # expect: FC107
        else:
            total = int(meta.kv_indptr_cpu[n])
            self.kv_indices_buf[:total].copy_(meta.kv_indices[:total], non_blocking=True)  # ok: FC104
            self.kv_indptr_cpu[: n + 1] = meta.kv_indptr_cpu
            self.kv_indptr_cpu[n + 1 : bs + 1] = total
            plan = functools.partial(self.graph_mla[bs].plan, **self._plan_kwargs())
            plan(self.qo_indptr_cpu[: bs + 1], self.kv_indptr_cpu[: bs + 1], self.kv_indices_buf, meta.seq_lens)  # expect: FC102
            self.kv_indices_buf[total:].zero_()  # expect: FC104
        self.block_table_buf[:n].copy_(meta.block_tables, non_blocking=True)  # ok: FC104

    def plan_verify(self, meta: MLADecodeMeta) -> None:
        n, q_len = meta.num_seqs, meta.q_len
        qo_indptr = torch.arange(0, (n + 1) * q_len, q_len, dtype=torch.int32, device=self.device)
        self.verify.plan(  # expect: FC102
            qo_indptr, meta.kv_indptr_cpu, meta.kv_indices, meta.seq_lens_cpu, **self._plan_kwargs(causal=True),
        )
        self.meta = meta

    def plan_prefill(self, qo_indptr_cpu: torch.Tensor) -> None:
        c = self.cfg
        self.prefill.plan(
            qo_indptr_cpu, qo_indptr_cpu, c.num_heads, c.num_heads, c.qk_nope_head_dim + c.qk_rope_head_dim,
            head_dim_vo=c.v_head_dim, causal=True, sm_scale=c.softmax_scale, q_data_type=torch.bfloat16,
        )

    def forward_decode(self, q_nope, q_pe, cache: LatentCache, bmm1_scale: float) -> torch.Tensor:
        meta, c = self.meta, self.cfg
        if meta.q_len > 1 or meta.num_seqs > c.max_graph_bs:
            return self.verify.run(q_nope, q_pe, cache.ckv, cache.kpe)  # expect: FC108
        if self._backend == "trtllm-gen":
            n = meta.num_seqs
            query = torch.cat([q_nope, q_pe], dim=-1).unsqueeze(1)
            kv = torch.cat([cache.ckv, cache.kpe], dim=-1).unsqueeze(1)
            out = trtllm_batch_decode_with_kv_cache_mla(
                query, kv, self.trtllm_workspace, c.qk_nope_head_dim, c.kv_lora_rank, c.qk_rope_head_dim,
                self.block_table_buf[:n], self.seq_lens_buf[:n], self.max_seq_len,
                bmm1_scale=bmm1_scale, bmm2_scale=1.0,
            )
            return out.squeeze(1)
        return self.graph_mla[c.bucket_for(meta.num_seqs)].run(q_nope, q_pe, cache.ckv, cache.kpe)  # ok: FC108

    def forward_prefill(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.prefill.run(q, k, v)

    def describe_plans(self) -> Dict[str, object]:
        out: Dict[str, object] = {"impl": getattr(self, "_backend")}  # ok: FC103
        for bs, w in self.graph_mla.items():
            out[f"bs{bs}"] = w.__dict__.get("_plan_info")  # expect: FC103
        return out
