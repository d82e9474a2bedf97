from __future__ import annotations

from typing import List

import numpy as np
import torch

from span_srt.backend import MixedSpanAttnBackend
from span_srt.cuda_graph_runner import CudaGraphRunner
from span_srt.forward_batch import ForwardBatch, ForwardMode
from span_srt.model import SpanModel
from spanattn.layout import HeadGroupLayout
from spanattn.pool import SpanKVPool
from spanattn.spans import SpanConfig


class ModelRunner:
    def __init__(self, cfg: SpanConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.page_size = cfg.page_size
        self.pools = [
            SpanKVPool(
                grp,
                cfg.num_layers,
                cfg.num_pages_per_group,
                cfg.page_size,
                cfg.head_dim,
                cfg.max_running,
                cfg.max_pages_per_req,
                device,
                kv_layout="HND" if (grp.is_global and cfg.global_trtllm) else "NHD",
            )
            for grp in cfg.groups
        ]
        self.layout = HeadGroupLayout(cfg.groups, cfg.num_qo_heads, cfg.num_kv_heads, device)
        self.attn_backend = MixedSpanAttnBackend(cfg, self.pools, device)
        self.model = SpanModel(cfg, self.layout).to(device=device, dtype=torch.bfloat16)
        self.graph_runner = CudaGraphRunner(self)
        self.graph_runner.capture()

    def make_batch(
        self,
        mode: ForwardMode,
        input_ids: List[int],
        positions: List[int],
        slots: List[int],
        seq_lens: List[int],
        extend_lens: List[int],
    ) -> ForwardBatch:
        """Host lists in; page allocation per group on the host, one H2D copy per field."""
        bs = len(slots)
        for pool in self.pools:
            for s, n in zip(slots, seq_lens):
                pool.ensure_pages(s, n)
        locs = []
        pos_np = np.asarray(positions, dtype=np.int64)
        row_np = np.repeat(np.asarray(slots, dtype=np.int64), extend_lens)
        for pool in self.pools:
            page = pool.block_table_np[row_np, pos_np // self.page_size].astype(np.int64)
            locs.append(torch.from_numpy(page * self.page_size + pos_np % self.page_size).to(self.device, non_blocking=True))
        seq_lens_cpu = torch.tensor(seq_lens, dtype=torch.int32)
        slots_cpu = torch.tensor(slots, dtype=torch.int64)
        extend_cpu = torch.tensor(extend_lens, dtype=torch.int32)
        qo_cpu = torch.zeros(bs + 1, dtype=torch.int32)
        torch.cumsum(extend_cpu, 0, out=qo_cpu[1:])
        return ForwardBatch(
            forward_mode=mode,
            batch_size=bs,
            input_ids=torch.tensor(input_ids, dtype=torch.int64).to(self.device, non_blocking=True),
            positions=torch.from_numpy(pos_np).to(self.device, non_blocking=True),
            req_slots=slots_cpu.to(self.device, non_blocking=True),
            req_slots_cpu=slots_cpu,
            seq_lens=seq_lens_cpu.to(self.device, non_blocking=True),
            seq_lens_cpu=seq_lens_cpu,
            out_locs=locs,
            attn_backend=self.attn_backend,
            extend_lens_cpu=extend_cpu,
            extend_qo_indptr=qo_cpu.to(self.device, non_blocking=True),
            extend_qo_indptr_cpu=qo_cpu,
        )

    def forward_decode(self, fb: ForwardBatch) -> torch.Tensor:
        if self.graph_runner.can_run(fb):
            logits = self.graph_runner.replay(fb)
        else:
            self.attn_backend.init_forward_metadata(fb)
            logits = self.model.forward_decode(fb.input_ids, fb.positions, fb)
        # every row gained one token: advance the graph's last-page lengths of the local groups
        # so that the next replay only has to patch rows whose window start moved
        for g in self.attn_backend.local_group_ids:
            self.attn_backend.graph_bufs[g].last_page_len[: fb.batch_size].remainder_(self.page_size).add_(1)  # expect: FC104
        return logits

    def forward_extend(self, fb: ForwardBatch) -> torch.Tensor:
        self.attn_backend.init_forward_metadata(fb)
        return self.model.forward_extend(fb.input_ids, fb.positions, fb)
