"""One CUDA graph per batch size; metadata comes from the backend's capture and replay hooks."""
import logging
from typing import Callable, Optional

import torch

from backends.flashinfer_backend import FlashInferAttnBackend
from pimeta.config import GRAPH_BATCH_SIZES
from pimeta.metadata import DecodeMetadata

logger = logging.getLogger(__name__)


class CudaGraphRunner:
    def __init__(self, forward: Callable, backend: FlashInferAttnBackend, hidden_size: int, draft: Optional[Callable]):
        self.forward, self.backend, self.hidden_size, self.draft = forward, backend, hidden_size, draft
        self._use_cuda_graph = torch.cuda.is_available()  # ok: FC103
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.static_out: dict[int, torch.Tensor] = {}
        max_bs, dev = GRAPH_BATCH_SIZES[-1], backend.device
        self.static_input_ids = torch.zeros(max_bs, dtype=torch.int64, device=dev)
        self.seq_lens_host = torch.zeros(max_bs, dtype=torch.int32, pin_memory=True)
        backend.init_cuda_graph_state(GRAPH_BATCH_SIZES)
        for bs, w in backend.graph_wrappers.items():
            if not w.is_cuda_graph_enabled:  # ok: FC103
                raise RuntimeError(f"bucket {bs}: decode wrapper is not in CUDA-graph mode")

    def capture(self) -> None:
        assert not self.graphs, "graphs were already captured"  # ok: FC109
        if not self._use_cuda_graph:
            return
        torch.cuda.synchronize()  # ok: FC101
        for bs in reversed(GRAPH_BATCH_SIZES):
            self.capture_one_batch_size(bs)

    def _check_bucket(self, bs: int) -> None:
        assert bs in GRAPH_BATCH_SIZES, f"{bs} is not a captured batch size"  # expect: FC109

    def capture_one_batch_size(self, bs: int) -> None:
        self._check_bucket(bs)
        meta = self.backend.init_forward_metadata_capture_cuda_graph(bs)
        ids = self.static_input_ids[:bs]
        ids.zero_()  # ok: FC104
        self.forward(ids, meta)
        torch.cuda.synchronize()  # ok: FC101
        self.static_out[bs] = torch.empty(bs, self.hidden_size, dtype=torch.bfloat16, device=ids.device)  # ok: FC107
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            h = self.forward(ids, meta)
            if self.draft is not None:
                h = self.draft(h, meta)
            logger.info(f"capturing bs={bs}: lengths {meta.seq_lens}")  # expect: FC101
            self.static_out[bs].copy_(h)
        self.graphs[bs] = g

    def replay_prepare(self, input_ids: torch.Tensor, meta: DecodeMetadata, bs: int) -> None:
        n = meta.batch_size
        self.backend.init_forward_metadata_replay_cuda_graph(bs, meta)
        if n > self.seq_lens_host.numel():
            self.seq_lens_host = torch.zeros(n, dtype=torch.int32, pin_memory=True)  # ok: FC107
        self.seq_lens_host[:n].copy_(meta.seq_lens)  # expect: FC101
        for name, src in (("static_input_ids", input_ids),):
            setattr(self, name, torch.nn.functional.pad(src, (0, bs - n)).clone())  # expect: FC107

    def replay(self, input_ids: torch.Tensor, meta: DecodeMetadata) -> torch.Tensor:
        n = meta.batch_size
        bs = min(b for b in GRAPH_BATCH_SIZES if b >= n)  # ok: FC101
        self.replay_prepare(input_ids, meta, bs)
        self.backend.bufs.kv_indptr[n + 1 : bs + 1].fill_(meta.total_pages)  # expect: FC104
        self.graphs[bs].replay()
        logger.debug("replayed bs=%d for %d rows, %d tokens", bs, n, meta.seq_lens.sum().item())  # expect: FC101
        out = self.static_out[bs][:n]
        self.static_out[bs] = torch.empty_like(self.static_out[bs])  # expect: FC107
        return out
