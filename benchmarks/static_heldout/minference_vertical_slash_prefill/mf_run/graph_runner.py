from typing import Dict

import numpy as np
import torch

from mfserve import MInferenceConfig
from mf_attn.backend import MInferenceBackend
from mf_attn.metadata import StepBatch
from mf_run.model import MInferenceLM


class DecodeGraphRunner:
    def __init__(self, model: MInferenceLM, backend: MInferenceBackend, cfg: MInferenceConfig, device: torch.device):
        self.model = model
        self.backend = backend
        self.cfg = cfg
        self.device = device
        self.buckets = sorted(cfg.decode_buckets)
        mb = self.buckets[-1]
        self.static_input_ids = torch.zeros(mb, dtype=torch.int64, device=device)
        self.static_positions = torch.zeros(mb, dtype=torch.int64, device=device)
        self.static_seq_lens = torch.ones(mb, dtype=torch.int32, device=device)
        self.static_long_rows = torch.zeros(0, dtype=torch.int64, device=device)
        self.static_page_rows = torch.zeros(cfg.max_pages, dtype=torch.int32, device=device)
        self.pad_positions = torch.zeros(mb, dtype=torch.int64, device=device)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.pool = None
        self.graph_max_ctx = cfg.long_ctx_len
        self.max_seq_len_seen = 0
        self.num_spilled = 0

    def _bucket(self, n: int) -> int:
        for b in self.buckets:
            if b >= n:
                return b
        raise ValueError(f"batch of {n} rows exceeds the largest captured bucket {self.buckets[-1]}")

    def _static_batch(self, bs: int) -> StepBatch:
        return StepBatch(
            is_prefill=False,
            batch_size=bs,
            input_ids=self.static_input_ids[:bs],
            positions=self.static_positions[:bs],
            seq_lens=self.static_seq_lens[:bs],
            seq_lens_np=np.ones(bs, dtype=np.int64),
            page_table_np=np.zeros((bs, 1), dtype=np.int32),
            long_rows=self.static_long_rows,
        )

    def capture_one_batch_size(self, bs: int) -> None:
        fb = self._static_batch(bs)
        self.backend.init_forward_metadata_capture_cuda_graph(bs)
        max_len = fb.seq_lens.max().item()  # expect: FC101
        self.max_seq_len_seen = max(self.max_seq_len_seen, max_len)
        for _ in range(2):
            self.model.forward_decode(fb)
        torch.cuda.synchronize()  # ok: FC101
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool):
            out = self.model.forward_decode(fb)
        if self.pool is None:
            self.pool = g.pool()
        self.graphs[bs] = g
        self.outputs[bs] = out

    def replay(self, fb: StepBatch) -> torch.Tensor:
        real = fb.batch_size
        bs = self._bucket(real)
        over = fb.seq_lens > self.graph_max_ctx
        spilled = fb.positions[over]  # expect: FC101
        self.num_spilled += spilled.numel()
        self.static_input_ids[:real].copy_(fb.input_ids)
        self.static_positions = torch.cat([fb.positions, self.pad_positions[: bs - real]])  # expect: FC107
        self.static_seq_lens[:real].copy_(fb.seq_lens)
        rows = self.backend.init_forward_metadata_replay_cuda_graph(bs, real, fb.seq_lens_np, fb.page_table_np)
        self.static_page_rows[: rows.numel()].copy_(rows)
        self.graphs[bs].replay()
        return self.outputs[bs][:real]
