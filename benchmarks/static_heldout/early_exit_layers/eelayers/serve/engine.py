"""The decode step: pick the depth from the last confidences, replay that depth's graph."""

from typing import List

import numpy as np
import torch

from eelayers.attn.groups import LayerGroupAttention
from eelayers.confidence import ConfidenceHead
from eelayers.config import ExitConfig
from eelayers.model import EarlyExitModel
from eelayers.serve.graphs import ExitDepthGraphs


class EarlyExitEngine:
    def __init__(self, cfg: ExitConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        G = cfg.num_groups
        self.head = ConfidenceHead(cfg.hidden_size, cfg.exit_threshold, G)
        self.attn = LayerGroupAttention(cfg, device)
        kv_caches = [
            [
                torch.zeros(cfg.num_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim, dtype=torch.bfloat16, device=device)
                for _ in range(cfg.layers_per_group)
            ]
            for _ in range(G)
        ]
        self.model = EarlyExitModel(cfg, self.attn, self.head, kv_caches).to(device)
        self.graphs = ExitDepthGraphs(cfg, self.model, self.attn, device)
        self.depth_hist_np = np.zeros(G + 1, dtype=np.int64)
        self.group_sizes = [cfg.layers_per_group] * G
        self.next_depth = G
        self.layers_run = 0

    def start(self) -> None:
        self.graphs.record_all()

    def decode_step(self, input_ids: torch.Tensor, group_pages: List[List[List[int]]], group_lens: List[List[int]],
                    backfill_qo_indptr_cpu: torch.Tensor) -> torch.Tensor:
        G = self.cfg.num_groups
        bs = self.attn.load_host_tables(group_pages, group_lens)
        depth = self.next_depth
        if self.cfg.backfill_inline and depth < G:
            self.attn.plan_backfill(depth, backfill_qo_indptr_cpu, bs)
        if bs <= self.graphs.max_bs:
            logits, confs = self.graphs.replay(depth, bs, input_ids)
            rows_depth = self.head.depth_per_row(confs, self.cfg.min_depth)
            for d in rows_depth.tolist():  # expect: FC101
                self.depth_hist_np[d] += 1
            # rows that passed early skip the deep groups next step: drop their newest slot there now
            exited = (rows_depth < G).to(torch.int32)
            for buf in self.attn.graph_last_page_len[depth:]:
                buf[:bs].sub_(exited)  # expect: FC104
        else:
            self.attn.plan_eager_groups(G, bs)
            logits, depth = self.model.forward_eager(input_ids)
            self.depth_hist_np[depth] += 1
        self.next_depth = max(self.cfg.min_depth, int(self.depth_hist_np.argmax()))  # ok: FC101
        self.layers_run += depth * min(self.group_sizes)  # ok: FC101
        if getattr(self, "_exit_counts", None) is None:
            self._exit_counts = torch.zeros(G + 1, dtype=torch.long, device=self.device)  # ok: FC107
        self._exit_counts[depth] += 1
        return torch.argmax(logits, dim=-1)
