"""Decoder CUDA graphs, one per batch-size bucket of concurrently decoded streams."""

from __future__ import annotations

import logging
from typing import Dict, Optional

import torch

from asrserve.decoder.attention import DecoderAttnBackend
from asrserve.decoder.metadata import DecodeMetadata, DecodeMetadataBuilder
from asrserve.decoder.model import StreamingDecoder
from asrserve.settings import ASRSettings

logger = logging.getLogger(__name__)


class DecoderGraphRunner:
    # per-hypothesis running state the captured scorer reads; reset before every replay
    _RESET_ON_REPLAY = ("static_hyp_scores", "static_blank_run")

    def __init__(self, model: StreamingDecoder, backend: DecoderAttnBackend, builder: DecodeMetadataBuilder, settings: ASRSettings, device: torch.device):
        self.model = model
        self.backend = backend
        self.builder = builder
        self.settings = settings
        self.device = device
        self.max_bs = max(settings.graph_buckets)
        self.static_tokens = torch.zeros(self.max_bs, dtype=torch.int64, device=device)
        self.static_positions = torch.zeros(self.max_bs, dtype=torch.int64, device=device)
        self.static_enc_lens = torch.zeros(self.max_bs, dtype=torch.int32, device=device)
        self.static_hyp_scores = torch.zeros(self.max_bs, dtype=torch.float32, device=device)
        self.static_blank_run = torch.zeros(self.max_bs, dtype=torch.int32, device=device)
        self._ctc_scratch: Optional[torch.Tensor] = None
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.mempool = None

    def capture_all(self) -> None:
        self.backend.init_cuda_graph_state()
        for bs in reversed(self.settings.graph_buckets):
            self.capture_one_bucket(bs)

    def capture_one_bucket(self, bs: int) -> None:
        meta = self.builder.dummy(bs)
        self.backend.init_forward_metadata_capture_cuda_graph(bs, meta)
        self.static_enc_lens[:bs].copy_(meta.enc_lens)
        lens = self.static_enc_lens[:bs].tolist()  # expect: FC101
        logger.info("capturing decoder bucket %d (encoder frames %s)", bs, lens)
        tok, pos = self.static_tokens[:bs], self.static_positions[:bs]
        self.model.decode_step(tok, pos, meta)
        torch.cuda.synchronize()  # ok: FC101
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.mempool):
            out = self.model.decode_step(tok, pos, meta)
        self.mempool = self.mempool or graph.pool()
        self.graphs[bs] = graph
        self.outputs[bs] = out

    def replay(self, tokens: torch.Tensor, positions: torch.Tensor, meta: DecodeMetadata) -> torch.Tensor:
        bs, bucket = meta.batch_size, meta.bucket
        for name in self._RESET_ON_REPLAY:
            setattr(self, name, torch.zeros_like(getattr(self, name)))  # expect: FC107
        if getattr(self, "_ctc_scratch", None) is None:
            self._ctc_scratch = torch.empty((self.max_bs, self.settings.vocab_size), dtype=torch.float32, device=self.device)  # ok: FC107
        self.static_tokens[:bs].copy_(tokens)
        self.static_positions[:bs].copy_(positions)
        self.static_enc_lens[:bs].copy_(meta.enc_lens)
        self.backend.init_forward_metadata_replay_cuda_graph(bs, meta)
        self.graphs[bucket].replay()
        torch.cuda.current_stream().synchronize()  # expect: FC101
        return self.outputs[bucket][:bs]
