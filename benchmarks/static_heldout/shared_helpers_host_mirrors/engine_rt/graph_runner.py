"""Decode graphs per batch size; static inputs are written before every replay."""

import torch

from engine_rt.attention import HelperAttnBackend
from engine_rt.batch import ForwardBatch
from engine_rt.model import TinyLM
from shmirror.config import EngineConfig


class GraphRunner:
    def __init__(self, model: TinyLM, backend: HelperAttnBackend, cfg: EngineConfig, device):
        self.model = model
        self.backend = backend
        self.cfg = cfg
        self.device = device
        self.graphs = {}
        self.outputs = {}
        self.pool = None
        max_bs = cfg.max_batch_size
        self.static_input_ids = torch.zeros(max_bs, dtype=torch.long, device=device)
        self.static_positions = torch.zeros(max_bs, dtype=torch.long, device=device)
        self.static_seq_lens = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.static_seq_lens_cpu = torch.ones(max_bs, dtype=torch.int32)
        self.static_write_pages = torch.zeros(max_bs, dtype=torch.long, device=device)
        self.static_write_offsets = torch.zeros(max_bs, dtype=torch.long, device=device)
        self.backend.init_graph_buffers()

    def _static_batch(self, bs: int) -> ForwardBatch:
        return ForwardBatch(
            input_ids=self.static_input_ids[:bs],
            positions=self.static_positions[:bs],
            seq_lens=self.static_seq_lens[:bs],
            seq_lens_cpu=self.static_seq_lens_cpu[:bs],
            kv_indices=self.backend.kv_indices_buf,
            write_pages=self.static_write_pages[:bs],
            write_offsets=self.static_write_offsets[:bs],
            is_decode=True,
            num_tokens=bs,
            graph_bs=bs,
        )

    def capture(self):
        for bs in sorted(self.cfg.graph_batch_sizes, reverse=True):
            self.capture_one_batch_size(bs)

    def capture_one_batch_size(self, bs: int):
        fb = self._static_batch(bs)
        self.backend.init_forward_metadata_capture_cuda_graph(bs, fb)
        for _ in range(2):
            self.model.decode(fb)
        torch.cuda.synchronize()  # ok: FC101
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = self.model.decode(fb)
        if self.pool is None:
            self.pool = graph.pool()
        self.graphs[bs] = graph
        self.outputs[bs] = out

    def replay(self, fb: ForwardBatch):
        raw_bs = fb.input_ids.shape[0]
        bs = fb.graph_bs
        self.static_input_ids[:raw_bs].copy_(fb.input_ids, non_blocking=True)
        self.static_positions[:raw_bs].copy_(fb.positions, non_blocking=True)
        self.static_seq_lens[:raw_bs].copy_(fb.seq_lens, non_blocking=True)
        self.static_seq_lens[raw_bs:bs].fill_(1)
        self.static_seq_lens_cpu[:raw_bs].copy_(fb.seq_lens_cpu)
        self.static_seq_lens_cpu[raw_bs:bs] = 1
        self.static_write_pages[:raw_bs].copy_(fb.write_pages, non_blocking=True)
        self.static_write_offsets[:raw_bs].copy_(fb.write_offsets, non_blocking=True)
        self.backend.init_forward_metadata_replay_cuda_graph(
            bs, self.static_seq_lens[:bs], self.static_seq_lens_cpu[:bs], fb.kv_indices
        )
        self.graphs[bs].replay()
        return self.outputs[bs][:raw_bs]
