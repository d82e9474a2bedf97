"""Decode graphs per batch size; each graph runs both layouts' graph wrappers and the tail merge."""

import numpy as np
import torch

from kvlayout.config import ServerConfig
from kvlayout.layouts import INDICES_BUF_ATTR
from layout_attn.backend import LayoutAttnBackend
from layout_attn.batch import LayoutBatch
from layout_attn.model import LayoutLM


class LayoutGraphRunner:
    def __init__(self, model: LayoutLM, backend: LayoutAttnBackend, cfg: ServerConfig, device):
        self.model = model
        self.backend = backend
        self.cfg = cfg
        self.device = device
        self.graphs = {}
        self.outputs = {}
        self.pool = None
        b = cfg.max_batch_size
        self.input_ids = torch.zeros(b, dtype=torch.long, device=device)
        self.seq_lens = torch.ones(b, dtype=torch.int32, device=device)
        self.row_layout = torch.zeros(b, dtype=torch.int8, device=device)
        self.nhd_write_pages = torch.zeros(b, dtype=torch.long, device=device)
        self.hnd_write_pages = torch.zeros(b, dtype=torch.long, device=device)
        self.write_offsets = torch.zeros(b, dtype=torch.long, device=device)

    def _static_batch(self, bs: int) -> LayoutBatch:
        return LayoutBatch(
            rids=list(range(bs)),
            input_ids=self.input_ids[:bs],
            seq_lens=self.seq_lens[:bs],
            seq_lens_np=np.ones(bs, dtype=np.int32),
            row_layout=self.row_layout[:bs],
            row_layout_np=np.zeros(bs, dtype=np.int8),
            pages=[[0]] * bs,
            tail_pages=[[]] * bs,
            nhd_write_pages=self.nhd_write_pages[:bs],
            hnd_write_pages=self.hnd_write_pages[:bs],
            write_offsets=self.write_offsets[:bs],
            graph_bs=bs,
        )

    def capture(self):
        for bs in sorted(self.cfg.graph_batch_sizes, reverse=True):
            self.capture_one_batch_size(bs)

    def capture_one_batch_size(self, bs: int):
        batch = self._static_batch(bs)
        self.backend.init_forward_metadata_capture_cuda_graph(bs, batch)
        for key in ("NHD", "HND"):
            w = self.backend.graph_wrappers[(key, bs)]
            if getattr(w, INDICES_BUF_ATTR) is not self.backend.graph_indices[key]:  # expect: FC103
                raise RuntimeError(f"{key} graph wrapper for bs={bs} copied its indices buffer")
        self.model.decode(batch)
        torch.cuda.synchronize()  # ok: FC101
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = self.model.decode(batch)
        if self.pool is None:
            self.pool = graph.pool()
        self.graphs[bs] = graph
        self.outputs[bs] = out

    def replay(self, batch: LayoutBatch, gbs: int):
        bs = batch.size
        self.input_ids[:bs].copy_(batch.input_ids, non_blocking=True)
        self.seq_lens[:bs].copy_(batch.seq_lens, non_blocking=True)
        self.seq_lens[bs:gbs].fill_(1)
        self.row_layout[:bs].copy_(batch.row_layout, non_blocking=True)
        self.nhd_write_pages[:bs].copy_(batch.nhd_write_pages, non_blocking=True)
        self.hnd_write_pages[:bs].copy_(batch.hnd_write_pages, non_blocking=True)
        self.write_offsets[:bs].copy_(batch.write_offsets, non_blocking=True)
        self.backend.init_forward_metadata_replay_cuda_graph(gbs, batch, self.seq_lens, self.row_layout)
        self.graphs[gbs].replay()
        return self.outputs[gbs][:bs]
