"""Decode graphs for the FA2 backend (trtllm-gen and the fallback run eagerly)."""
from __future__ import annotations

import bisect
import math
from typing import Dict

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper

from fb_backends.base import AttentionBackendBase, StepInputs
from fb_backends.fa2 import FlashInferFA2Backend
from fb_engine.model import ChainModel
from fbchain.config import ChainConfig, graph_workspace_bytes


class DecodeGraphs:
    def __init__(self, cfg: ChainConfig, fa2: FlashInferFA2Backend, model: ChainModel, device: torch.device):
        self.cfg = cfg
        self.fa2 = fa2
        self.model = model
        self.device = device
        self.page_size = cfg.page_size
        self.sizes = sorted(b for b in cfg.graph_bs if b <= cfg.max_num_seqs)
        self.max_bs = self.sizes[-1]
        self.workspace = torch.zeros(graph_workspace_bytes(), dtype=torch.uint8, device=device)  # expect: FC106
        mb = self.max_bs
        self.indptr = torch.zeros(mb + 1, dtype=torch.int32, device=device)
        self.indices = torch.zeros(cfg.num_pages, dtype=torch.int32, device=device)
        self.last_page_len = torch.ones(mb, dtype=torch.int32, device=device)
        self.indptr_cpu = torch.zeros(mb + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_len_cpu = torch.ones(mb, dtype=torch.int32, pin_memory=True)
        self.input_ids = torch.zeros(mb, dtype=torch.int64, device=device)
        self.positions = torch.zeros(mb, dtype=torch.int64, device=device)
        self.slot_mapping = torch.zeros(mb, dtype=torch.int64, device=device)
        self.seq_lens = torch.ones(mb, dtype=torch.int32, device=device)
        self.wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.pool = None

    def bucket(self, n: int) -> int:
        return self.sizes[bisect.bisect_left(self.sizes, n)]

    def can_run(self, inputs: StepInputs, backend: AttentionBackendBase) -> bool:
        return backend is self.fa2 and inputs.num_reqs <= self.max_bs

    def _plan_args(self) -> dict:
        c = self.cfg
        return dict(num_qo_heads=c.num_qo_heads, num_kv_heads=c.num_kv_heads, head_dim=c.head_dim, page_size=c.page_size)

    def _static_inputs(self, bs: int) -> StepInputs:
        return StepInputs(
            num_reqs=bs,
            num_tokens=bs,
            is_decode=True,
            input_ids=self.input_ids[:bs],
            positions=self.positions[:bs],
            slot_mapping=self.slot_mapping[:bs],
            seq_lens=self.seq_lens[:bs],
            seq_lens_cpu=torch.ones(bs, dtype=torch.int32),
            qo_indptr=torch.arange(bs + 1, dtype=torch.int32, device=self.device),
            qo_indptr_cpu=torch.arange(bs + 1, dtype=torch.int32),
            kv_indptr=self.indptr[: bs + 1],
            kv_indptr_cpu=self.indptr_cpu[: bs + 1],
            kv_indices=self.indices,
            kv_last_page_len_cpu=self.last_page_len_cpu[:bs],
            block_table=torch.zeros((bs, 1), dtype=torch.int32, device=self.device),
            window_layers=self.cfg.window_layers,
        )

    def capture_bucket(self, bs: int) -> None:
        w = BatchDecodeWithPagedKVCacheWrapper(
            self.workspace,
            "NHD",
            use_cuda_graph=True,
            use_tensor_cores=True,
            backend="fa2",
            paged_kv_indptr_buffer=self.indptr[: bs + 1],
            paged_kv_indices_buffer=self.indices,
            paged_kv_last_page_len_buffer=self.last_page_len[:bs],
        )
        self.last_page_len[:bs].fill_(1)  # ok: FC104
        self.indptr_cpu[: bs + 1] = torch.arange(bs + 1, dtype=torch.int32)
        self.last_page_len_cpu[:bs] = 1
        w.plan(self.indptr_cpu[: bs + 1], self.indices[:bs], self.last_page_len_cpu[:bs], **self._plan_args())
        self.wrappers[bs] = w
        inputs = self._static_inputs(bs)
        for _ in range(2):
            self.model.forward_decode(inputs, self.fa2, w)
        torch.cuda.synchronize()  # ok: FC101
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool):
            out = self.model.forward_decode(inputs, self.fa2, w)
        self.pool = g.pool()
        self.graphs[bs] = g
        self.outputs[bs] = out

    def capture_all(self) -> None:
        for bs in reversed(self.sizes):
            self.capture_bucket(bs)

    def replay(self, inputs: StepInputs) -> torch.Tensor:
        n = inputs.num_reqs
        bs = self.bucket(n)
        max_pages = math.ceil(inputs.max_seq_len / self.page_size)  # expect: FC101
        if max_pages * bs > self.indices.numel():
            raise RuntimeError(f"bucket {bs} cannot hold {max_pages} pages per request")
        if inputs.slot_mapping.shape[0] > self.slot_mapping.shape[0]:
            self.slot_mapping = torch.zeros(inputs.slot_mapping.shape[0], dtype=torch.int64, device=self.device)  # expect: FC107
        self.input_ids[:n].copy_(inputs.input_ids)
        self.positions[:n].copy_(inputs.positions)
        self.slot_mapping[:n].copy_(inputs.slot_mapping)
        self.seq_lens[:n].copy_(inputs.seq_lens)
        nnz = int(inputs.kv_indptr_cpu[n])
        self.indptr_cpu[: n + 1].copy_(inputs.kv_indptr_cpu[: n + 1])
        self.indptr_cpu[n + 1 : bs + 1].fill_(nnz)
        self.last_page_len_cpu[:n].copy_(inputs.kv_last_page_len_cpu[:n])
        self.last_page_len_cpu[n:bs].fill_(1)
        self.indices[:nnz].copy_(inputs.kv_indices[:nnz], non_blocking=True)  # ok: FC104
        self.wrappers[bs].plan(self.indptr_cpu[: bs + 1], self.indices[:nnz], self.last_page_len_cpu[:bs], **self._plan_args())
        self.graphs[bs].replay()
        return self.outputs[bs][:n]
