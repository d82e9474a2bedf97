"""Decode graphs per batch size; each entry keeps its graph and the static tensors it reads."""

from dataclasses import dataclass

import torch

from asyncserve.config import AsyncEngineConfig
from asyncserve.protocol import DevicePlan
from gpu.attn_backend import AsyncFlashInferBackend
from gpu.model import AsyncLM


@dataclass
class GraphEntry:
    graph: torch.cuda.CUDAGraph
    input_ids: torch.Tensor
    positions: torch.Tensor
    seq_lens: torch.Tensor
    write_pages: torch.Tensor
    write_offsets: torch.Tensor
    logits: torch.Tensor


class DecodeGraphs:
    def __init__(self, model: AsyncLM, backend: AsyncFlashInferBackend, cfg: AsyncEngineConfig, device):
        self.model = model
        self.backend = backend
        self.cfg = cfg
        self.device = device
        self.entries = {}
        self.pool = None
        b = cfg.max_batch_size
        self.input_ids = torch.zeros(b, dtype=torch.long, device=device)
        self.positions = torch.zeros(b, dtype=torch.long, device=device)
        self.seq_lens = torch.ones(b, dtype=torch.int32, device=device)
        self.write_pages = torch.zeros(b, dtype=torch.long, device=device)
        self.write_offsets = torch.zeros(b, dtype=torch.long, device=device)

    def _static_plan(self, bs: int) -> DevicePlan:
        host_indptr = torch.arange(bs + 1, dtype=torch.int32)
        host_last = torch.ones(bs, dtype=torch.int32)
        empty_i32 = torch.zeros(0, dtype=torch.int32, device=self.device)
        return DevicePlan(
            bs=bs,
            graph_bs=bs,
            is_decode=True,
            num_tokens=bs,
            max_seq_len=1,
            use_trtllm=False,
            input_ids=self.input_ids[:bs],
            positions=self.positions[:bs],
            seq_lens_dev=self.seq_lens[:bs],
            extend_lens_dev=self.seq_lens[:bs],
            kv_indptr_dev=self.backend.kv_indptr_buf[: bs + 1],
            kv_indptr_cpu=host_indptr,
            kv_indices_dev=self.backend.kv_indices_buf[:bs],
            kv_indices_cpu=torch.arange(bs, dtype=torch.int32),
            last_page_cpu=host_last,
            qo_indptr_dev=self.backend.kv_indptr_buf[: bs + 1],
            qo_indptr_cpu=host_indptr,
            chunk_indptr_cpu=host_indptr,
            chunk_indices_dev=self.backend.kv_indices_buf[:bs],
            chunk_last_page_cpu=host_last,
            append_slots_dev=empty_i32.long(),
            append_pages_dev=empty_i32,
            write_pages=self.write_pages[:bs],
            write_offsets=self.write_offsets[:bs],
        )

    def capture_all(self):
        if not hasattr(self.backend.decode_wrapper, "_cached_module"):  # expect: FC103
            raise RuntimeError("run one eager decode step before capturing: the decode module is not loaded yet")
        for bs in sorted(self.cfg.graph_batch_sizes, reverse=True):
            self.capture_one_batch_size(bs)

    def capture_one_batch_size(self, bs: int):
        plan = self._static_plan(bs)
        self.backend.init_forward_metadata_capture_cuda_graph(bs, plan)
        self.model.forward_decode(plan)
        warm = torch.cuda.Event()
        warm.record()
        warm.synchronize()  # ok: FC101
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            logits = self.model.forward_decode(plan)
        if self.pool is None:
            self.pool = graph.pool()
        self.entries[bs] = GraphEntry(
            graph=graph,
            input_ids=plan.input_ids,
            positions=plan.positions,
            seq_lens=plan.seq_lens_dev,
            write_pages=plan.write_pages,
            write_offsets=plan.write_offsets,
            logits=logits,
        )

    def replay(self, plan: DevicePlan):
        entry = self.entries.get(plan.graph_bs)
        bs = plan.bs
        entry.input_ids[:bs].copy_(plan.input_ids)
        entry.positions = plan.positions.clone()  # expect: FC107
        entry.seq_lens[:bs].copy_(plan.seq_lens_dev[:bs])
        entry.write_pages[:bs].copy_(plan.write_pages)
        entry.write_offsets[:bs].copy_(plan.write_offsets)
        self.backend.init_forward_metadata_replay_cuda_graph(plan.graph_bs, plan)
        entry.graph.replay()
        return entry.logits[:bs]
