"""Split-KV attention. A long prompt's prior KV is cut into chunks, each attended by its own
prefill wrapper (non-causal), the prompt's own tail by a causal wrapper, and the partial outputs
merged by LSE. Decode runs bucket graphs; with ``split_decode`` the frozen prompt prefix is
attended by a second wrapper and merged in the graph."""

import math
from typing import Dict

import flashinfer
import torch
from flashinfer.prefill import trtllm_batch_context_with_kv_cache

from splitkv import GRAPH_FLAG_ATTR, DecodeRows, SplitConfig, SplitPlan
from splitkv_attn.chunk_tensors import ChunkStep, plan_chunk, upload_plan
from splitkv_attn.merge import lse_weights, merge_partials
from splitkv_attn.workspace import chunk_workspaces, trtllm_context_workspace


class SplitAttnBackend:
    def __init__(self, cfg: SplitConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        # prefill: one wrapper per KV chunk plus the causal tail
        self.chunk_ws = chunk_workspaces(cfg, device)
        self.chunk_wrappers = [flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD") for ws in self.chunk_ws[:-1]]
        self.tail_wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(self.chunk_ws[-1], "NHD")
        self.trtllm_ws = trtllm_context_workspace(cfg.trtllm_workspace_bytes(), device.index or 0)
        self.current = None
        self.lse_scratch = None

        # decode
        self.graph_workspace = torch.zeros(SplitConfig.GRAPH_WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.eager_workspace = torch.zeros(cfg.eager_workspace_bytes, dtype=torch.uint8, device=device)  # ok: FC106
        self.prefix_workspace = torch.zeros(cfg.eager_workspace_bytes, dtype=torch.uint8, device=device)
        self.decode_eager = flashinfer.BatchDecodeWithPagedKVCacheWrapper(self.eager_workspace, "NHD")
        self.prefix_decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper(self.prefix_workspace, "NHD")
        mb = max(cfg.buckets)
        self.dec_indices = torch.zeros(cfg.max_pages, dtype=torch.int32, device=device)
        self.dec_indptr_host = torch.zeros(mb + 1, dtype=torch.int32, pin_memory=True)
        self.dec_last_host = torch.ones(mb, dtype=torch.int32, pin_memory=True)
        self.prefix_indptr_host = torch.zeros(mb + 1, dtype=torch.int32, pin_memory=True)
        self.prefix_last_host = torch.ones(mb, dtype=torch.int32, pin_memory=True)
        self.decode_seq_lens = torch.zeros(mb, dtype=torch.int32, device=device)
        self.eager_last_dev = torch.ones(cfg.max_batch, dtype=torch.int32, device=device)
        self.graph_bufs: Dict[int, Dict[str, torch.Tensor]] = {}
        self.graph_decode: Dict[int, flashinfer.BatchDecodeWithPagedKVCacheWrapper] = {}
        self.planned_pages = 0
        self.live_rows = 0

    def _decode_kwargs(self) -> dict:
        c = self.cfg
        return dict(
            num_qo_heads=c.num_qo_heads,
            num_kv_heads=c.num_kv_heads,
            head_dim=c.head_dim,
            page_size=c.page_size,
            q_data_type=torch.bfloat16,
        )

    # ---- prefill ------------------------------------------------------------------------
    def _ensure_eager(self, wrapper) -> None:
        # older builds captured warm-up graphs through the chunk wrappers; make sure they plan eagerly
        setattr(wrapper, GRAPH_FLAG_ATTR, False)  # expect: FC103

    def plan_chunks(self, plan: SplitPlan, staged: torch.Tensor) -> None:
        c = self.cfg
        ct = upload_plan(plan, staged, c.page_size, self.device)
        total_pages = 0
        for i, w in enumerate(self.chunk_wrappers[: plan.num_chunks]):
            self._ensure_eager(w)
            total_pages += ct.kv_page_counts[i].item()  # expect: FC101
            plan_chunk(w, ct.qo_indptr, ct.kv_indptr[i], ct.kv_indices[i], ct.kv_last_page_len_cpu, c, causal=False)
        tail_n = len(plan.tail_pages)
        kv_total = plan.prefix_len + plan.q_len
        qo_indptr_cpu = torch.tensor([0, plan.q_len], dtype=torch.int32)
        tail_indptr_cpu = torch.tensor([0, tail_n], dtype=torch.int32)
        tail_last_cpu = torch.tensor([kv_total - (plan.tail_first_page + tail_n - 1) * c.page_size], dtype=torch.int32)
        tail_indices = staged[plan.tail_first_page : plan.tail_first_page + tail_n]
        self.tail_wrapper.plan(  # ok: FC102
            qo_indptr_cpu,
            tail_indptr_cpu,
            tail_indices,
            tail_last_cpu,
            c.num_qo_heads,
            c.num_kv_heads,
            c.head_dim,
            c.page_size,
            causal=True,
            q_data_type=torch.bfloat16,
        )
        self.planned_pages = total_pages
        self.current = ChunkStep(
            tensors=ct,
            num_chunks=plan.num_chunks,
            block_table=staged[None, :],
            seq_lens=torch.tensor([kv_total], dtype=torch.int32, device=self.device),
            cu_seqlens_q=torch.tensor([0, plan.q_len], dtype=torch.int32, device=self.device),
            cu_seqlens_kv=torch.tensor([0, kv_total], dtype=torch.int32, device=self.device),
            max_kv_len=kv_total,
        )

    def prefill_attend(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        step = self.current
        n = q.shape[0]
        if step.num_chunks == 0 and self.cfg.use_trtllm_single_chunk:
            return trtllm_batch_context_with_kv_cache(
                query=q,
                kv_cache=kv_cache,
                workspace_buffer=self.trtllm_ws,
                block_tables=step.block_table,
                seq_lens=step.seq_lens,
                max_q_len=n,
                max_kv_len=step.max_kv_len,
                bmm1_scale=1.0 / math.sqrt(self.cfg.head_dim),
                bmm2_scale=1.0,
                batch_size=1,
                cum_seq_lens_q=step.cu_seqlens_q,
                cum_seq_lens_kv=step.cu_seqlens_kv,
            )
        if self.lse_scratch is None or self.lse_scratch.shape[0] < n:
            self.lse_scratch = torch.empty(n, self.cfg.num_qo_heads, dtype=torch.float32, device=self.device)  # expect: FC107
        outs, lses = [], []
        for w in self.chunk_wrappers[: step.num_chunks]:
            o, s = w.run(q, kv_cache, return_lse=True)
            outs.append(o)
            lses.append(s)
        o, s = self.tail_wrapper.run(q, kv_cache, return_lse=True)
        outs.append(o)
        lses.append(s)
        out, lse = merge_partials(outs, lses)
        self.lse_scratch[:n].copy_(lse)
        return out

    def workspace_report(self) -> dict:
        per_chunk = {}
        for i, w in enumerate(self.chunk_wrappers):
            per_chunk[i] = w._int_workspace_buffer.numel()  # expect: FC103
        return {"chunk_int_workspace_bytes": per_chunk, "planned_pages": self.planned_pages}

    # ---- decode -------------------------------------------------------------------------
    def build_bucket(self, bs: int) -> None:
        indptr = torch.zeros(bs + 1, dtype=torch.int32, device=self.device)
        last = torch.ones(bs, dtype=torch.int32, device=self.device)
        self.graph_bufs[bs] = {"indptr": indptr, "last": last}
        self.graph_decode[bs] = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            self.graph_workspace,
            "NHD",
            use_cuda_graph=True,
            paged_kv_indptr_buffer=indptr,
            paged_kv_indices_buffer=self.dec_indices,
            paged_kv_last_page_len_buffer=last,
        )

    def plan_for_capture(self, bs: int) -> None:
        indptr = torch.arange(bs + 1, dtype=torch.int32)
        last = torch.ones(bs, dtype=torch.int32)
        self.graph_decode[bs].plan(indptr, self.dec_indices[:bs], last, **self._decode_kwargs())
        if self.cfg.split_decode:
            self.prefix_decode.plan(indptr, self.dec_indices[:bs], last, **self._decode_kwargs())

    def _plan_prefix(self, bs: int, rows: DecodeRows) -> None:
        real_bs = rows.batch_size
        self.prefix_indptr_host[: real_bs + 1].copy_(torch.from_numpy(rows.prefix_indptr_np))
        self.prefix_indptr_host[real_bs + 1 : bs + 1] = int(rows.prefix_indptr_np[-1])
        self.prefix_last_host[:real_bs].copy_(torch.from_numpy(rows.prefix_last_np))
        self.prefix_last_host[real_bs:bs] = 1
        indices = torch.from_numpy(rows.prefix_indices_np).to(self.device, non_blocking=True)
        self.prefix_decode.plan(
            self.prefix_indptr_host[: bs + 1], indices, self.prefix_last_host[:bs], **self._decode_kwargs()
        )

    def prepare_decode_replay(self, bs: int, rows: DecodeRows) -> None:
        real_bs = rows.batch_size
        nnz = int(rows.indptr_np[-1])
        self.dec_indptr_host[: real_bs + 1].copy_(torch.from_numpy(rows.indptr_np))
        self.dec_indptr_host[real_bs + 1 : bs + 1] = nnz
        self.dec_last_host[:real_bs].copy_(torch.from_numpy(rows.last_np))
        self.dec_last_host[real_bs:bs] = 1
        bufs = self.graph_bufs[bs]
        bufs["indptr"].copy_(self.dec_indptr_host[: bs + 1], non_blocking=True)  # ok: FC104
        self.dec_indices[:nnz].copy_(torch.from_numpy(rows.indices_np), non_blocking=True)
        self.decode_seq_lens[:real_bs].copy_(rows.seq_lens_cpu, non_blocking=True)
        self.decode_seq_lens[real_bs:bs].zero_()
        self.graph_decode[bs].plan(  # ok: FC102
            self.dec_indptr_host[: bs + 1], self.dec_indices[:nnz], self.dec_last_host[:bs], **self._decode_kwargs()
        )
        if self.cfg.split_decode:
            self._plan_prefix(bs, rows)
        # padding rows get empty KV ranges
        bufs["indptr"][real_bs + 1 :].fill_(nnz)  # expect: FC104
        lens = self.decode_seq_lens[:bs]
        live = lens > 0
        self.live_rows = lens[live].numel()  # expect: FC101

    def plan_eager_decode(self, rows: DecodeRows) -> None:
        bs = rows.batch_size
        self.eager_last_dev[:bs].copy_(torch.from_numpy(rows.last_np), non_blocking=True)
        indices = torch.from_numpy(rows.indices_np).to(self.device, non_blocking=True)
        self.decode_eager.plan(  # expect: FC102
            **dict(
                indptr=torch.from_numpy(rows.indptr_np),
                indices=indices,
                last_page_len=self.eager_last_dev[:bs],
                **self._decode_kwargs(),
            )
        )

    def decode_attend(self, q: torch.Tensor, kv_cache: torch.Tensor, bs: int) -> torch.Tensor:
        out, lse = self.graph_decode[bs].run(q, kv_cache, return_lse=True)  # ok: FC108
        if self.cfg.split_decode:
            old, old_lse = self.prefix_decode.run(q, kv_cache, return_lse=True)  # expect: FC108
            wgt = lse_weights(lse, old_lse)
            out = out * wgt[..., None] + old * (1.0 - wgt)[..., None]
        return out

    def decode_attend_eager(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return self.decode_eager.run(q, kv_cache)
