import logging
from dataclasses import dataclass
from typing import Dict, List

import torch

from backends.flashinfer_paged import PagedDecodeBackend, fill_tail
from metadata.builders import GraphCaptureBuilder
from rcengine.batch import StepMeta
from rcengine.config import ServeConfig
from rcengine.protocols import AttentionImpl, SupportsCudaGraph
from runtime.model import TinyDecoder

logger = logging.getLogger(__name__)

_JIT_MODULE = "_cached_module"
_STATIC_INPUTS = ("input_ids", "positions")


@dataclass
class CapturedGraph:
    graph: torch.cuda.CUDAGraph
    logits: torch.Tensor


class GraphRunner:
    """Captures decode graphs for the backends that pass `isinstance(b, SupportsCudaGraph)`."""

    def __init__(self, cfg: ServeConfig, model: TinyDecoder, backends: List[AttentionImpl], builder: GraphCaptureBuilder):
        assert all(isinstance(b, AttentionImpl) for b in backends), "backend without forward_decode"  # expect: FC109
        self.cfg, self.model, self.builder = cfg, model, builder
        self.device = torch.device(cfg.device)
        self.graph_backends: List[SupportsCudaGraph] = [b for b in backends if isinstance(b, SupportsCudaGraph)]
        self.paged = next(b for b in backends if isinstance(b, PagedDecodeBackend))
        self.max_bs = max(cfg.capture_batch_sizes)
        self.input_ids = torch.zeros(self.max_bs, dtype=torch.int64, device=self.device)
        self.positions = torch.zeros(self.max_bs, dtype=torch.int64, device=self.device)
        self.static_logits: Dict[int, torch.Tensor] = {}
        self.graphs: Dict[int, CapturedGraph] = {}
        self._captured = False

    def capture(self) -> None:
        n_graph = len(self.graph_backends)
        assert n_graph > 0, "no backend supports CUDA graphs"  # ok: FC109
        for b in self.graph_backends:
            b.init_cuda_graph_state(self.max_bs)
        for bs in sorted(self.cfg.capture_batch_sizes, reverse=True):
            self.capture_one_batch_size(bs)
        torch.cuda.synchronize()  # ok: FC101
        self._captured = True

    def capture_one_batch_size(self, bs: int) -> None:
        meta = self.builder.build_for_cudagraph_capture(bs)
        for b in self.graph_backends:
            b.init_forward_metadata_capture_cuda_graph(bs, meta)
        fill_tail(self.paged.last_page_len_buf, bs, 1)  # expect: FC104
        self.model.decode(self.input_ids[:bs], self.positions[:bs], meta)
        torch.cuda.synchronize()  # ok: FC101
        self.static_logits[bs] = torch.empty(bs, 128256, dtype=torch.bfloat16, device=self.device)  # ok: FC107
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            self.static_logits[bs].copy_(self.model.decode(self.input_ids[:bs], self.positions[:bs], meta))
        pages = self.paged.kv_indptr_buf[: bs + 1].tolist()  # expect: FC101
        logger.info("captured bs=%d over %d dummy pages", bs, pages[-1])
        self.graphs[bs] = CapturedGraph(g, self.static_logits[bs])
        for w in self.paged.graph_wrappers.values():
            if getattr(w, _JIT_MODULE, None) is None:  # expect: FC103
                raise RuntimeError("graph wrapper has no compiled module; run warm-up first")

    def replay(self, meta: StepMeta) -> torch.Tensor:
        assert self._captured, "replay() before capture()"  # ok: FC109
        real, bs = meta.batch.batch_size, meta.graph_bs
        for name in _STATIC_INPUTS:
            setattr(self, name, getattr(meta.batch, name).clone())  # expect: FC107
        self.paged.last_page_len_buf[real:bs].fill_(1)  # ok: FC104
        for b in self.graph_backends:
            b.init_forward_metadata_replay_cuda_graph(bs, meta)
        self.paged.kv_indptr_buf[real + 1 : bs + 1].fill_(int(meta.padded_kv_indptr_cpu[real]))  # expect: FC104
        self.graphs[bs].graph.replay()
        if bs - real > 8:  # ok: FC101
            logger.warning("padded %d rows; longest sequence %d" % (bs - real, meta.batch.seq_lens.max()))  # expect: FC101
        return self.graphs[bs].logits[:real]
