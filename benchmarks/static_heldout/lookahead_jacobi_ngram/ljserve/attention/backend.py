"""FlashInfer attention for lookahead decoding.

Every step a request contributes ``1 + W*(N-1) + G*(N-1)`` query rows (the last accepted token, the Jacobi window
and the candidate n-grams).  They attend to the request's KV pages and, through a packed custom mask, to each other
along the lookahead structure.  The query layout is the same at every step, so the verify forward is captured once
per batch-size bucket with a graph-mode paged-prefill wrapper; larger batches run an eager verifier, and contexts
past the captured range run trtllm-gen's decode kernel with ``T`` query rows per request.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Dict, List, Optional

import numpy as np
import torch
import flashinfer
from flashinfer import BatchDecodeWithPagedKVCacheWrapper
from flashinfer import BatchPrefillWithPagedKVCacheWrapper as PrefillW
from flashinfer import trtllm_batch_decode_with_kv_cache

from ljserve.config import VERIFY_WORKSPACE_BYTES, LookaheadConfig


@dataclass
class StepMetadata:
    batch_size: int
    bucket: int
    qo_indptr: torch.Tensor            # device copy, for the eager verifier
    qo_indptr_cpu: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_indices: torch.Tensor           # device, flattened page ids
    kv_last_page_len_cpu: torch.Tensor
    packed_mask: torch.Tensor          # device, bit-packed lookahead mask
    seq_lens: torch.Tensor             # device, KV length after this step's append
    out_cache_loc: torch.Tensor        # device slot ids of the T new tokens of every request
    num_pages: int
    max_kv_len: int
    num_sampling: int = 0
    sampling_rows: Optional[torch.Tensor] = None
    sampling_kv_indptr_cpu: Optional[torch.Tensor] = None
    block_tables: Optional[torch.Tensor] = None


@dataclass
class PromptMetadata:
    qo_indptr_host: torch.Tensor
    out_cache_loc: torch.Tensor
    last_rows: torch.Tensor


def lookahead_block_mask(window: int, ngram: int, verify: int) -> np.ndarray:
    """[T, T] mask of one query block: the window rows see their own column's past rows and the key token,
    the verify rows see the key token and their own n-gram's earlier tokens."""
    n1 = ngram - 1
    T = 1 + window * n1 + verify * n1
    mask = np.zeros((T, T), dtype=bool)
    mask[:, 0] = True
    for w in range(window):
        for j in range(n1):
            row = 1 + w * n1 + j
            for wp in range(w + 1):
                mask[row, 1 + wp * n1 + j] = True
    base = 1 + window * n1
    for g in range(verify):
        for j in range(n1):
            row = base + g * n1 + j
            mask[row, base + g * n1 : row + 1] = True
    return mask


class LookaheadAttnBackend:
    def __init__(self, cfg: LookaheadConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self._kv_layout = "NHD"
        max_bs = cfg.max_batch_size
        T = cfg.tokens_per_request
        max_pages = max_bs * cfg.max_pages_per_request()
        self.sm_scale = cfg.head_dim ** -0.5

        # Buffers the verify graphs read by address.
        self.qo_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices = torch.zeros(max_pages, dtype=torch.int32, device=device)
        self.kv_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.mask_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.custom_mask = torch.zeros(max_bs * T * (cfg.max_seq_len + T) // 8, dtype=torch.uint8, device=device)

        # Pinned host mirrors handed to plan(), and what the last graph plan was made for.
        self.qo_indptr_cpu = torch.arange(max_bs + 1, dtype=torch.int32).mul_(T).pin_memory()
        self.kv_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_len_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.last_planned_indptr_cpu = torch.full((max_bs + 1,), -1, dtype=torch.int32, pin_memory=True)
        self._block_mask = lookahead_block_mask(cfg.window_size, cfg.ngram_size, cfg.max_verify)

        self.verify_workspace = torch.zeros(VERIFY_WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.decode_workspace = torch.empty(cfg.decode_workspace_mb << 20, dtype=torch.uint8, device=device)  # ok: FC105
        self.prompt_workspace = torch.zeros(cfg.prefill_workspace_bytes(cfg.max_prefill_tokens), dtype=torch.uint8, device=device)  # ok: FC106
        self.trtllm_workspace = torch.empty(cfg.trtllm_workspace_bytes(), dtype=torch.uint8, device=device)  # expect: FC105

        self.eager_verify = PrefillW(self.verify_workspace, self.kv_layout)
        self.plain_decode = BatchDecodeWithPagedKVCacheWrapper(self.decode_workspace, self.kv_layout, use_tensor_cores=True)
        self.prompt_prefill = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(self.prompt_workspace, self.kv_layout)
        self.graph_wrappers: Dict[int, PrefillW] = {}

    @property
    def kv_layout(self) -> str:
        return self._kv_layout  # ok: FC103

    # ------------------------------------------------------------------ set-up
    def init_cuda_graph_state(self) -> None:
        for bs in self.cfg.graph_buckets:
            self.graph_wrappers[bs] = PrefillW(
                self.verify_workspace,
                self.kv_layout,
                use_cuda_graph=True,
                qo_indptr_buf=self.qo_indptr[: bs + 1],
                paged_kv_indptr_buf=self.kv_indptr[: bs + 1],
                paged_kv_indices_buf=self.kv_indices,
                paged_kv_last_page_len_buf=self.kv_last_page_len[:bs],
                custom_mask_buf=self.custom_mask,
                mask_indptr_buf=self.mask_indptr[: bs + 1],
            )
        # rows past a batch are empty requests: one token on one page
        self.kv_last_page_len.fill_(1)  # ok: FC104

    def check_layouts(self) -> None:
        for bs, w in self.graph_wrappers.items():
            layout = w._kv_layout  # expect: FC103
            if layout != self.kv_layout:
                raise RuntimeError(f"verify graph for bucket {bs} was built with layout {layout}")

    # ------------------------------------------------------------------ metadata (host)
    def build_step_metadata(
        self,
        seq_lens_cpu: torch.Tensor,
        page_table_np: np.ndarray,
        out_cache_loc_np: np.ndarray,
        sampling: List[int],
    ) -> StepMetadata:
        cfg = self.cfg
        bs = seq_lens_cpu.shape[0]
        bucket = cfg.bucket_for(bs)
        T = cfg.tokens_per_request
        kv_lens_np = seq_lens_cpu.numpy() + T
        pages_np = (kv_lens_np + cfg.page_size - 1) // cfg.page_size
        indptr_np = np.zeros(bs + 1, dtype=np.int32)
        np.cumsum(pages_np, out=indptr_np[1:])
        num_pages = int(indptr_np[-1])
        self.kv_indptr_cpu[: bs + 1] = torch.from_numpy(indptr_np)
        self.kv_last_page_len_cpu[:bs] = torch.from_numpy(((kv_lens_np - 1) % cfg.page_size + 1).astype(np.int32))
        if bucket > bs:
            self.kv_indptr_cpu[bs + 1 : bucket + 1] = num_pages
            self.kv_last_page_len_cpu[bs:bucket] = 1
        flat = np.concatenate([page_table_np[i, : pages_np[i]] for i in range(bs)])

        masks = [np.concatenate([np.ones((T, int(s)), dtype=bool), self._block_mask], axis=1) for s in seq_lens_cpu.numpy()]
        mask_dev = torch.from_numpy(np.concatenate([m.reshape(-1) for m in masks])).to(self.device, non_blocking=True)
        packed = flashinfer.packbits(mask_dev, bitorder="little")

        meta = StepMetadata(
            batch_size=bs,
            bucket=bucket,
            qo_indptr=self.qo_indptr_cpu[: bs + 1].to(self.device, non_blocking=True),
            qo_indptr_cpu=self.qo_indptr_cpu,
            kv_indptr_cpu=self.kv_indptr_cpu,
            kv_indices=torch.from_numpy(flat).to(self.device, non_blocking=True),
            kv_last_page_len_cpu=self.kv_last_page_len_cpu,
            packed_mask=packed,
            seq_lens=torch.from_numpy(kv_lens_np).to(self.device, non_blocking=True),
            out_cache_loc=torch.from_numpy(out_cache_loc_np).to(self.device, non_blocking=True),
            num_pages=num_pages,
            max_kv_len=int(kv_lens_np.max()),
            num_sampling=len(sampling),
        )
        if sampling:
            sel = np.asarray(sampling, dtype=np.int64)
            sub = np.zeros(len(sampling) + 1, dtype=np.int32)
            np.cumsum(pages_np[sel], out=sub[1:])
            meta.sampling_rows = torch.from_numpy(sel * T).to(self.device, non_blocking=True)
            meta.sampling_kv_indptr_cpu = torch.from_numpy(sub)
        if bucket == 0 and int(kv_lens_np.max()) > cfg.max_seq_len // 2:
            meta.block_tables = torch.from_numpy(page_table_np[:bs]).to(self.device, non_blocking=True)
        return meta

    def dummy_metadata(self, bs: int) -> StepMetadata:
        seq_lens_cpu = torch.full((bs,), self.cfg.page_size, dtype=torch.int32)
        pages = self.cfg.max_pages_per_request()
        table = np.arange(bs * pages, dtype=np.int32).reshape(bs, pages)
        locs = np.arange(bs * self.cfg.tokens_per_request, dtype=np.int64)
        return self.build_step_metadata(seq_lens_cpu, table, locs, [])

    # ------------------------------------------------------------------ plans
    def verify_plan_is_current(self, meta: StepMetadata) -> bool:
        wrapper = self.graph_wrappers[meta.bucket]
        planned = getattr(wrapper, "_plan_info", None)  # expect: FC103
        if planned is None:
            return False
        n = meta.bucket + 1
        return torch.equal(self.last_planned_indptr_cpu[:n], meta.kv_indptr_cpu[:n])  # ok: FC101

    def plan_verify(self, meta: StepMetadata) -> None:
        bs, bucket = meta.batch_size, meta.bucket
        # The graph reads page ids from its own buffer: fill it before plan().
        self.kv_indices[: meta.num_pages].copy_(meta.kv_indices, non_blocking=True)  # ok: FC104
        wrapper = self.graph_wrappers[bucket]
        wrapper.plan(  # ok: FC102
            meta.qo_indptr_cpu[: bucket + 1],
            meta.kv_indptr_cpu[: bucket + 1],
            self.kv_indices,
            meta.kv_last_page_len_cpu[:bucket],
            self.cfg.num_qo_heads,
            self.cfg.num_kv_heads,
            self.cfg.head_dim,
            self.cfg.page_size,
            packed_custom_mask=meta.packed_mask,
            sm_scale=self.sm_scale,
            q_data_type=torch.bfloat16,
        )
        # padded rows of the bucket must look like empty requests to the captured kernels
        if bucket > bs:
            self.kv_last_page_len[bs:bucket].fill_(1)  # expect: FC104
        self.last_planned_indptr_cpu[: bucket + 1].copy_(meta.kv_indptr_cpu[: bucket + 1])  # ok: FC104

    def plan_eager_verify(self, meta: StepMetadata) -> None:
        bs = meta.batch_size
        self.eager_verify.plan(  # expect: FC102
            meta.qo_indptr,
            meta.kv_indptr_cpu[: bs + 1],
            meta.kv_indices,
            meta.kv_last_page_len_cpu[:bs],
            self.cfg.num_qo_heads,
            self.cfg.num_kv_heads,
            self.cfg.head_dim,
            self.cfg.page_size,
            packed_custom_mask=meta.packed_mask,
            sm_scale=self.sm_scale,
            q_data_type=torch.bfloat16,
        )

    def plan_plain_decode(self, meta: StepMetadata) -> None:
        # sampling requests (temperature > 0) decode their last-token row with the plain decode kernel
        rows = meta.sampling_rows // self.cfg.tokens_per_request
        last_page_len = (meta.seq_lens[rows] - 1) % self.cfg.page_size + 1
        plan_fn = self.plain_decode.plan
        plan_fn(  # expect: FC102
            meta.sampling_kv_indptr_cpu,
            meta.kv_indices,
            last_page_len,
            self.cfg.num_qo_heads,
            self.cfg.num_kv_heads,
            self.cfg.head_dim,
            self.cfg.page_size,
            q_data_type=torch.bfloat16,
        )

    def plan_prompt(self, extend_lens_cpu: torch.Tensor) -> None:
        qo_indptr_host = torch.zeros(extend_lens_cpu.numel() + 1, dtype=torch.int32)
        torch.cumsum(extend_lens_cpu, dim=0, out=qo_indptr_host[1:])
        plan = functools.partial(
            self.prompt_prefill.plan,
            num_qo_heads=self.cfg.num_qo_heads,
            num_kv_heads=self.cfg.num_kv_heads,
            head_dim_qk=self.cfg.head_dim,
            causal=True,
        )
        plan(qo_indptr_host, qo_indptr_host)  # ok: FC102

    # ------------------------------------------------------------------ kernels
    def forward_verify(self, q: torch.Tensor, kv_cache, meta: StepMetadata) -> torch.Tensor:
        wrapper = self.graph_wrappers.get(meta.bucket, self.eager_verify)
        return wrapper.run(q, kv_cache)  # ok: FC108

    def forward_plain(self, q: torch.Tensor, kv_cache, meta: StepMetadata) -> torch.Tensor:
        return self.plain_decode.run(q, kv_cache)  # expect: FC108

    def forward_long(self, q: torch.Tensor, kv_cache, meta: StepMetadata) -> torch.Tensor:
        return trtllm_batch_decode_with_kv_cache(
            q,
            kv_cache,
            self.trtllm_workspace,
            meta.block_tables,
            meta.seq_lens,
            meta.max_kv_len,
            bmm1_scale=self.sm_scale,
            bmm2_scale=1.0,
            q_len_per_req=self.cfg.tokens_per_request,
        )

    def forward_prompt(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.prompt_prefill.run(q, k, v)
