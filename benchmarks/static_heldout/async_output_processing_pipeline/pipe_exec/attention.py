"""FlashInfer attention for the pipelined engine: graph-mode decode per bucket, ragged prefill."""

from dataclasses import dataclass
from typing import Dict, List, Optional

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithRaggedKVCacheWrapper

from asyncpipe.config import PipelineConfig


class PagedKVPool:
    def __init__(self, cfg: PipelineConfig, device):
        self.page_size = cfg.page_size
        shape = (cfg.num_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim)
        self.kv = [torch.zeros(shape, dtype=torch.bfloat16, device=device) for _ in range(cfg.num_layers)]
        self._free: List[int] = list(range(cfg.num_pages - 1, 0, -1))  # page 0: the null page

    def alloc(self, n: int) -> np.ndarray:
        if n > len(self._free):
            raise RuntimeError(f"KV pool exhausted: {n} pages wanted, {len(self._free)} free")
        return np.array([self._free.pop() for _ in range(n)], dtype=np.int32)

    def free(self, pages_np: np.ndarray) -> None:
        self._free.extend(pages_np.tolist())

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor) -> None:
        cache = self.kv[layer]
        pages, offs = slots // self.page_size, slots % self.page_size
        cache[pages, 0, offs] = k
        cache[pages, 1, offs] = v


@dataclass
class DecodeMetadata:
    batch_size: int
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_indices: torch.Tensor
    last_page_len_cpu: torch.Tensor
    slot_mapping: torch.Tensor
    max_seq_len: int = 0
    graph_bs: Optional[int] = None

    @classmethod
    def dummy(cls, bs: int, device) -> "DecodeMetadata":
        return cls(
            batch_size=bs,
            seq_lens=torch.ones(bs, dtype=torch.int32, device=device),
            seq_lens_cpu=torch.ones(bs, dtype=torch.int32),
            kv_indptr_cpu=torch.arange(bs + 1, dtype=torch.int32),
            kv_indices=torch.zeros(bs, dtype=torch.int32, device=device),
            last_page_len_cpu=torch.ones(bs, dtype=torch.int32),
            slot_mapping=torch.zeros(bs, dtype=torch.int64, device=device),
            max_seq_len=1,
            graph_bs=bs,
        )


@dataclass
class PrefillMetadata:
    num_tokens: int
    qo_indptr_cpu: torch.Tensor
    slot_mapping: torch.Tensor
    positions: torch.Tensor
    last_rows: torch.Tensor


class FlashInferPipelineBackend:
    WORKSPACE_BYTES = 192 << 20

    def __init__(self, cfg: PipelineConfig, pool: PagedKVPool, device):
        self.cfg = cfg
        self.pool = pool
        self.device = device
        self.sm_scale = cfg.head_dim**-0.5
        self.softcap_layer_set = frozenset(cfg.softcap_layers)
        self.prefill_workspace = torch.empty(cfg.prefill_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
        self.ragged = BatchPrefillWithRaggedKVCacheWrapper(self.prefill_workspace, "NHD", backend="fa2")
        self.softcap_prefill_workspace = torch.zeros(cfg.prefill_workspace_bytes(), dtype=torch.uint8, device=device)
        self.ragged_softcap = BatchPrefillWithRaggedKVCacheWrapper(self.softcap_prefill_workspace, "NHD", backend="fa2")
        self.decode_workspace = torch.zeros(cfg.decode_workspace_bytes(), dtype=torch.uint8, device=device)
        self.decode_eager = BatchDecodeWithPagedKVCacheWrapper(self.decode_workspace, "NHD", use_tensor_cores=True)
        self.softcap_workspace = torch.zeros(cfg.decode_workspace_bytes(), dtype=torch.uint8, device=device)
        self.softcap_decode = BatchDecodeWithPagedKVCacheWrapper(self.softcap_workspace, "NHD", use_tensor_cores=True)
        self.graph_workspace = torch.zeros(self.WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106

        max_bs = max(cfg.decode_buckets)
        self.graph_kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.graph_kv_indices = torch.zeros(max_bs * cfg.max_pages_per_seq, dtype=torch.int32, device=device)
        self.graph_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_len_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.slot_mapping = torch.zeros(max(max_bs, cfg.max_prefill_tokens), dtype=torch.int64, device=device)
        self.graph_decode: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.md: Optional[DecodeMetadata] = None
        self.pm: Optional[PrefillMetadata] = None

    def _decode_plan_args(self, softcap: bool) -> dict:
        return dict(
            num_qo_heads=self.cfg.num_qo_heads,
            num_kv_heads=self.cfg.num_kv_heads,
            head_dim=self.cfg.head_dim,
            page_size=self.cfg.page_size,
            q_data_type=torch.bfloat16,
            sm_scale=self.sm_scale,
            logits_soft_cap=self.cfg.attn_logit_softcap if softcap else None,
        )

    def init_cuda_graph_state(self) -> None:
        self.graph_last_page_len.fill_(1)  # ok: FC104
        for bs in self.cfg.decode_buckets:
            self.graph_decode[bs] = BatchDecodeWithPagedKVCacheWrapper(
                self.graph_workspace,
                "NHD",
                use_cuda_graph=True,
                use_tensor_cores=True,
                paged_kv_indptr_buffer=self.graph_kv_indptr[: bs + 1],
                paged_kv_indices_buffer=self.graph_kv_indices,
                paged_kv_last_page_len_buffer=self.graph_last_page_len[:bs],
            )

    # ------------------------------------------------------------------ eager decode
    def init_forward_metadata(self, md: DecodeMetadata) -> None:
        self.md = md
        self.pm = None
        bs = md.batch_size
        md.max_seq_len = int(md.seq_lens.max())  # expect: FC101
        if md.max_seq_len > self.cfg.max_position_embeddings:
            raise ValueError(f"sequence of {md.max_seq_len} tokens exceeds the RoPE table")
        self.slot_mapping[:bs].copy_(md.slot_mapping, non_blocking=True)
        # seq_lens stay on the device between pipelined steps: page counts derived there
        pages = (md.seq_lens + self.cfg.page_size - 1) // self.cfg.page_size
        kv_indptr = torch.zeros(bs + 1, dtype=torch.int32, device=self.device)
        torch.cumsum(pages, 0, out=kv_indptr[1:])
        self.decode_eager.plan(kv_indptr, md.kv_indices, md.last_page_len_cpu, **self._decode_plan_args(False))  # expect: FC102
        self.softcap_decode.plan(md.kv_indptr_cpu, md.kv_indices, md.last_page_len_cpu, **self._decode_plan_args(True))

    # ------------------------------------------------------------------ prefill
    def init_forward_metadata_prefill(self, pm: PrefillMetadata) -> None:
        self.pm = pm
        self.md = None
        self.slot_mapping[: pm.num_tokens].copy_(pm.slot_mapping, non_blocking=True)
        for w, cap in ((self.ragged, None), (self.ragged_softcap, self.cfg.attn_logit_softcap)):
            w.plan(
                pm.qo_indptr_cpu,
                pm.qo_indptr_cpu,
                self.cfg.num_qo_heads,
                self.cfg.num_kv_heads,
                self.cfg.head_dim,
                causal=True,
                sm_scale=self.sm_scale,
                logits_soft_cap=cap,
                q_data_type=torch.bfloat16,
            )

    # ------------------------------------------------------------------ graphs
    def init_forward_metadata_capture_cuda_graph(self, bs: int, md: DecodeMetadata) -> None:
        self.md = md
        self.indptr_cpu[: bs + 1].copy_(md.kv_indptr_cpu)
        self.last_page_len_cpu[:bs] = 1
        w = self.graph_decode[bs]
        w.plan(self.indptr_cpu[: bs + 1], self.graph_kv_indices, self.last_page_len_cpu[:bs], **self._decode_plan_args(False))
        rows = w._paged_kv_indptr_buf.numel() - 1  # expect: FC103
        if rows != bs:
            raise RuntimeError(f"decode graph for {bs} rows is bound to an indptr of {rows} rows")
        self.softcap_decode.plan(md.kv_indptr_cpu, md.kv_indices, md.last_page_len_cpu, **self._decode_plan_args(True))

    def init_forward_metadata_replay_cuda_graph(self, bs: int, md: DecodeMetadata) -> None:
        n = md.batch_size
        self.md = md
        max_len = int(md.seq_lens_cpu[:n].max())  # ok: FC101
        if max_len > self.cfg.max_position_embeddings:
            raise ValueError(f"sequence of {max_len} tokens exceeds the RoPE table")
        nnz = int(md.kv_indptr_cpu[n])
        self.indptr_cpu[: n + 1].copy_(md.kv_indptr_cpu[: n + 1])
        self.indptr_cpu[n + 1 : bs + 1] = nnz
        self.last_page_len_cpu[:n].copy_(md.last_page_len_cpu[:n])
        self.last_page_len_cpu[n:bs] = 1
        self.graph_kv_indices[:nnz].copy_(md.kv_indices[:nnz], non_blocking=True)  # ok: FC104
        self.graph_decode[bs].plan(  # ok: FC102
            self.indptr_cpu[: bs + 1], self.graph_kv_indices, self.last_page_len_cpu[:bs], **self._decode_plan_args(False)
        )
        self.softcap_decode.plan(
            self.indptr_cpu[: bs + 1], self.graph_kv_indices, self.last_page_len_cpu[:bs], **self._decode_plan_args(True)
        )

    # ------------------------------------------------------------------ forward
    def write_kv(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        self.pool.write(layer, k, v, self.slot_mapping[: k.shape[0]])

    def forward_decode(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        kv = self.pool.kv[layer]
        if layer in self.softcap_layer_set:
            return self.softcap_decode.run(q, kv)  # expect: FC108
        md = self.md
        w = self.decode_eager if md.graph_bs is None else self.graph_decode[md.graph_bs]
        return w.run(q, kv)  # ok: FC108

    def forward_prefill(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        w = self.ragged_softcap if layer in self.softcap_layer_set else self.ragged
        return w.run(q, k, v)
