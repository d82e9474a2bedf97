"""Per-bucket CUDA graphs over the decode step."""
from typing import Dict

import torch

from attn.flashinfer_backend import FlashInferBackend
from fluentmeta import GRAPH_BUCKETS, ForwardBatch
from runtime.model import TinyModel


class CudaGraphRunner:
    def __init__(self, model: TinyModel, backend: FlashInferBackend):
        self.model, self.backend = model, backend
        self.buckets = sorted(GRAPH_BUCKETS)
        self.max_bs = self.buckets[-1]
        dev = backend.device
        self.input_ids = torch.zeros(self.max_bs, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(self.max_bs, dtype=torch.int64, device=dev)
        self.seq_lens = torch.ones(self.max_bs, dtype=torch.int32, device=dev)
        self.seq_lens_cpu = torch.ones(self.max_bs, dtype=torch.int32)
        self.req_pool_indices = torch.zeros(self.max_bs, dtype=torch.int64, device=dev)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.pool = None
        backend.init_cuda_graph_state(self.max_bs)

    def capture(self) -> None:
        hidden = self.backend.cfg.num_qo_heads * self.backend.cfg.head_dim
        self.hidden_out = torch.zeros(self.max_bs, hidden, device=self.backend.device)  # ok: FC107
        for bs in reversed(self.buckets):
            self.capture_one_batch_size(bs)
        torch.cuda.synchronize()  # ok: FC101
        assert len(self.graphs) == len(self.buckets), "a bucket failed to capture"  # ok: FC109

    def capture_one_batch_size(self, bs: int) -> None:
        lens, lens_cpu, req = self.seq_lens[:bs], self.seq_lens_cpu[:bs], self.req_pool_indices[:bs]
        batch = ForwardBatch(bs, True, self.input_ids[:bs], self.positions[:bs], lens, lens_cpu, req)
        self.backend.init_forward_metadata_capture_cuda_graph(
            bs, batch.seq_lens, batch.seq_lens_cpu, batch.req_pool_indices
        )
        if self.backend.graph_builders[bs].wrapper._fixed_batch_size != bs:  # expect: FC103
            raise RuntimeError(f"graph wrapper for bucket {bs} was built for another batch size")
        for _ in range(2):
            self.model.decode(batch)
        torch.cuda.synchronize()  # ok: FC101
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            self.hidden_out[:bs].copy_(self.model.decode(batch))
        self.pool = graph.pool()
        self.graphs[bs] = graph
        self.backend.graph_kv_last_page_len.fill_(1)  # expect: FC104

    def replay(self, batch: ForwardBatch) -> torch.Tensor:
        assert batch.batch_size <= self.max_bs, "batch larger than the largest captured graph"  # expect: FC109
        raw_bs = batch.batch_size
        bs = next(b for b in self.buckets if b >= raw_bs)
        if batch.seq_lens_cpu.max().item() > self.backend.cfg.max_context_len:  # ok: FC101
            raise ValueError("request longer than the captured graphs allow")
        self.seq_lens_cpu[:raw_bs].copy_(batch.seq_lens)  # expect: FC101
        if not torch.equal(self.req_pool_indices[:raw_bs], batch.req_pool_indices):  # expect: FC101
            self.req_pool_indices[:raw_bs].copy_(batch.req_pool_indices)
        self.seq_lens[:raw_bs].copy_(batch.seq_lens)  # ok: FC104
        self.input_ids[:raw_bs].copy_(batch.input_ids)
        setattr(self, "positions", batch.positions.clone())  # expect: FC107
        self.last_lens_cpu = batch.seq_lens_cpu.clone()  # ok: FC107
        if raw_bs < bs:
            self.seq_lens[raw_bs:bs].fill_(1)
            self.seq_lens_cpu[raw_bs:bs].fill_(1)
            self.backend.graph_kv_last_page_len[raw_bs:bs].fill_(1)  # ok: FC104
        self.backend.init_forward_metadata_replay_cuda_graph(
            bs, self.seq_lens[:bs], self.seq_lens_cpu[:bs], self.req_pool_indices[:bs]
        )
        if raw_bs < bs:
            self.backend.graph_kv_indptr[raw_bs + 1 : bs + 1] = self.backend.graph_kv_indptr[raw_bs]  # expect: FC104
        self.graphs[bs].replay()
        torch.cuda.current_stream().synchronize()  # expect: FC101
        return self.hidden_out[:raw_bs]
