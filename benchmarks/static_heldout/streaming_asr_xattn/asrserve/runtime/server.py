"""The streaming server: audio arrives in 40 ms chunks, every chunk is encoded and every tick decodes one token
per active stream (greedy, with blank suppression and word timestamps from the cross-attention offsets)."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Dict, List

import numpy as np
import torch

from asrserve.decoder.attention import DecoderAttnBackend
from asrserve.decoder.metadata import DecodeMetadataBuilder
from asrserve.decoder.model import DecoderPagePool, StreamingDecoder
from asrserve.encoder import StreamingEncoder
from asrserve.frontend.features import FeatureChunker
from asrserve.runtime.graph_runner import DecoderGraphRunner
from asrserve.settings import ASRSettings

logger = logging.getLogger(__name__)


@torch.jit.script
def suppress_blank(logits: torch.Tensor, blank_id: int) -> torch.Tensor:
    assert logits.dim() == 2  # ok: FC109
    logits[:, blank_id] = -1.0e4
    return logits


@dataclass
class Stream:
    sid: int
    row: int
    tokens: List[int] = field(default_factory=lambda: [1])
    timestamps: List[int] = field(default_factory=list)
    closed: bool = False


class StreamingASRServer:
    def __init__(self, settings: ASRSettings, device: torch.device):
        self.settings = settings
        self.device = device
        self.chunker = FeatureChunker(settings.sample_rate, settings.hop_ms, settings.chunk_ms, settings.n_mels)
        self.encoder = StreamingEncoder(settings, device)
        self.backend = DecoderAttnBackend(settings, device)
        self.pool = DecoderPagePool(settings, device)
        self.decoder = StreamingDecoder(settings, self.pool, self.backend).to(device)
        self.builder = DecodeMetadataBuilder(self.backend, self.pool, settings, device)
        self.runner = DecoderGraphRunner(self.decoder, self.backend, self.builder, settings, device)
        self.streams: Dict[int, Stream] = {}
        self.free_rows = list(range(settings.max_streams - 1, -1, -1))
        self.pending: Dict[int, List[np.ndarray]] = {}

    def open_stream(self, sid: int) -> None:
        self.streams[sid] = Stream(sid, self.free_rows.pop())

    def on_audio_chunk(self, sid: int, pcm: np.ndarray) -> None:
        self.pending.setdefault(sid, []).extend(self.chunker.push(sid, pcm))

    def encode_tick(self) -> None:
        ready = [sid for sid, chunks in self.pending.items() if chunks]
        if not ready:
            return
        rows_np = np.array([self.streams[sid].row for sid in ready], dtype=np.int64)
        feats = [self.pending[sid].pop(0) for sid in ready]
        enc = self.encoder.encode_chunks(feats, rows_np)
        pages = self.backend.enc_pages
        slots = np.concatenate([pages.append_chunk(int(r), enc.shape[1]) for r in rows_np])
        self.decoder.project_encoder(enc.reshape(-1, enc.shape[-1]), torch.from_numpy(slots).to(self.device, non_blocking=True))
        pages.publish(rows_np)

    def decode_tick(self) -> Dict[int, List[int]]:
        active = [s for s in self.streams.values() if not s.closed and self.backend.enc_pages.enc_lens_np[s.row] > 0]
        if not active:
            return {}
        rows_np = np.array([s.row for s in active], dtype=np.int64)
        dec_lens_np = np.array([len(s.tokens) - 1 for s in active], dtype=np.int64)
        tokens = torch.tensor([s.tokens[-1] for s in active], dtype=torch.int64).to(self.device, non_blocking=True)
        positions = torch.from_numpy(dec_lens_np).to(self.device, non_blocking=True)
        meta = self.builder.build(rows_np, dec_lens_np)
        if meta.bucket:
            logits = self.runner.replay(tokens, positions, meta)
        else:
            self.backend.init_forward_metadata(meta)
            logits = self.decoder.decode_step(tokens, positions, meta)
        if len(active) > 1:
            logits = suppress_blank(logits, self.settings.blank_id)
        next_tokens = logits.argmax(dim=-1)
        tokens_host = next_tokens.cpu()  # ok: FC101
        offsets = self.backend.enc_pos_offsets
        out: Dict[int, List[int]] = {}
        for i, s in enumerate(active):
            tok = int(tokens_host[i])
            s.tokens.append(tok)
            if offsets is not None and i < offsets.shape[0]:
                s.timestamps.append(i)
            if tok == self.settings.eos_id or len(s.tokens) >= self.settings.max_decode_len:
                s.closed = True
            out[s.sid] = [tok]
        return out

    def close_stream(self, sid: int) -> None:
        s = self.streams.pop(sid)
        self.backend.enc_pages.release(s.row)
        self.chunker.close(sid)
        self.free_rows.append(s.row)

    async def serve(self, inbox: "asyncio.Queue") -> None:
        self.runner.capture_all()
        while True:
            while not inbox.empty():
                kind, sid, payload = inbox.get_nowait()
                if kind == "open":
                    self.open_stream(sid)
                elif kind == "audio":
                    self.on_audio_chunk(sid, payload)
                elif kind == "close":
                    self.close_stream(sid)
            self.encode_tick()
            for sid, toks in self.decode_tick().items():
                logger.debug("stream %d: %s", sid, toks)
            await asyncio.sleep(0.04)
