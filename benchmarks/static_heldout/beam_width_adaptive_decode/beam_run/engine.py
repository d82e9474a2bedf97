import logging
from typing import Dict, List

import numpy as np
import torch

from beam_attn.backend import BeamAttentionBackend
from beam_attn.metadata import BeamMetadataBuilder
from beamserve import BeamConfig, BeamRequest, BeamTable, PagePool

from .graph_runner import BeamGraphRunner
from .model import BeamLM

logger = logging.getLogger(__name__)


class BeamEngine:
    def __init__(self, cfg: BeamConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.table = BeamTable(cfg.max_requests, cfg.max_beam, device)
        self.pool = PagePool(cfg.max_pages, cfg.page_size, cfg.max_beam, device)
        self.backend = BeamAttentionBackend(cfg, self.table, device)
        self.backend.init_graph_wrappers()
        self.builder = BeamMetadataBuilder(cfg, self.table, self.backend, device)
        self.model = BeamLM(cfg, self.backend).to(device)
        self.kv_cache = torch.zeros(
            cfg.num_layers, cfg.max_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim,
            dtype=torch.bfloat16, device=device,
        )
        self.runner = BeamGraphRunner(cfg, self.model, self.backend, self.kv_cache)
        self.running: Dict[int, BeamRequest] = {}

    def adapt_widths(self, requests: List[BeamRequest], entropy_host: np.ndarray) -> None:
        for r, h in zip(requests, entropy_host.tolist()):
            width = min(self.cfg.max_beam, max(1, int(round(h * 2))))
            if width > r.width:
                r.beam_pages.extend(self.pool.fork(r.beam_pages[0], width - r.width))
                r.beam_lens.extend([r.beam_lens[0]] * (width - r.width))
            r.width = width
            self.table.set_width(r.slot, width)

    def prune(self, request: BeamRequest, keep: List[int], row_offset: int, page_offset: int) -> None:
        dropped = [i for i in range(len(request.beam_pages)) if i not in keep]
        for i in dropped:
            self.pool.release(request.beam_pages[i])
        n_pages = sum(len(request.beam_pages[i]) for i in dropped)
        # scrub the dropped beams' pages so a stale graph cannot read them
        self.backend.kv_indices_buf[page_offset : page_offset + n_pages] = self.pool.null_page  # expect: FC104
        self.backend.parent_rows_buf[row_offset : row_offset + len(keep)] = torch.tensor(keep, device=self.device)  # ok: FC104
        request.beam_pages = [request.beam_pages[i] for i in keep]
        request.beam_lens = [request.beam_lens[i] for i in keep]

    def step(self, requests: List[BeamRequest], tokens: torch.Tensor) -> torch.Tensor:
        md = self.builder.build(requests)
        if md.graph_key is not None:
            return self.runner.replay(md, tokens)
        self.backend.init_forward_metadata(md)
        return self.model.decode_step(tokens, self.kv_cache, md)

    def finalize(self, request: BeamRequest) -> List[float]:
        scores = self.table.scores[request.slot, : request.width]
        finished = scores.tolist()  # ok: FC101
        self.pool.release([p for beam in request.beam_pages for p in beam])
        request.finished = True
        return finished
