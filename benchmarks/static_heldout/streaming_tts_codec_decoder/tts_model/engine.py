import logging
import threading
from typing import Dict, List

import numpy as np
import torch

from tts_attn.backends import DepthAttention, TextAttention, kernels_loaded
from ttscore import ChunkScheduler, StreamState, TTSConfig

from .codec import CodecDecoder
from .depth import DepthDecoder
from .graphs import TTSGraphRunner
from .text_lm import TextLM

logger = logging.getLogger(__name__)


class StreamingTTSEngine:
    def __init__(self, cfg: TTSConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.text_attn = TextAttention(cfg, device)
        self.depth_attn = DepthAttention(cfg, device)
        self.graph_ws = torch.empty(cfg.text_workspace_bytes() * 2, dtype=torch.uint8, device=device)
        self.text_attn.init_text_graphs(self.graph_ws)
        self.depth_attn.init_depth_graphs()
        self.lm = TextLM(cfg, self.text_attn).to(device)
        self.depth = DepthDecoder(cfg, self.depth_attn, cfg.text_heads * cfg.head_dim).to(device)
        self.codec = CodecDecoder(cfg.num_codebooks, cfg.codebook_size).to(device)
        self.kv_cache = torch.zeros(cfg.text_layers, cfg.num_pages, 2, cfg.page_size, cfg.text_kv_heads,
                                    cfg.head_dim, dtype=torch.bfloat16, device=device)
        self.runner = TTSGraphRunner(cfg, self.lm, self.depth, self.text_attn, self.depth_attn, self.kv_cache)
        self.scheduler = ChunkScheduler(cfg.max_streams, cfg.max_context)
        self.kv_lens_gpu = torch.zeros(cfg.max_streams, dtype=torch.int32, device=device)
        self.prev_codes = torch.zeros(cfg.max_streams, cfg.num_codebooks, dtype=torch.int64, device=device)
        self.pcm_ring = torch.zeros(cfg.max_streams, 48000 * 4, dtype=torch.float32, device=device)
        self.pcm_pinned = torch.zeros(cfg.max_streams, 1920 * cfg.frames_per_chunk, pin_memory=True)
        self.frames_emitted_cpu = torch.zeros(0, dtype=torch.int64)
        self.copy_done = torch.cuda.Event()
        self.out_thread = threading.Thread(target=self._emit_audio, daemon=True)

    def warm(self) -> None:
        if not kernels_loaded(self.text_attn.text_graph):
            self.runner.capture_text_graphs()
            self.runner.capture_depth_graphs()
        logger.info("codec decoder on %s", self.codec._backend)  # ok: FC103

    def _tables(self, streams: List[StreamState]):
        counts = np.array([len(s.pages) for s in streams], dtype=np.int32)
        indptr = np.zeros(len(streams) + 1, dtype=np.int32)
        np.cumsum(counts, out=indptr[1:])
        last = (np.array([s.kv_len for s in streams], dtype=np.int32) - 1) % self.cfg.page_size + 1
        pages = torch.tensor([p for s in streams for p in s.pages], dtype=torch.int32)
        return indptr, pages.to(self.device, non_blocking=True), last

    def step_chunk(self, tokens: torch.Tensor) -> Dict[int, int]:
        streams = self.scheduler.next_chunk()
        bs = len(streams)
        padded = next(b for b in self.cfg.stream_buckets if b >= bs)
        emitted: Dict[int, int] = {}
        for f in range(self.cfg.frames_per_chunk):
            indptr, pages, last = self._tables(streams)
            h = self.runner.replay_text(bs, padded, tokens[:bs], self.prev_codes[:bs], self.kv_lens_gpu[:bs],
                                        (indptr, pages, last))
            codes = self.depth.decode_frame(h, padded)
            logger.debug("frame %d codes %s", f, codes)  # ok: FC101
            self.prev_codes[:bs].copy_(codes)
            pcm = self.codec(codes)
            self.pcm_ring[:bs, f * pcm.shape[1] : (f + 1) * pcm.shape[1]] = pcm  # ok: FC104
            if (codes == self.cfg.eos_code).any():  # expect: FC101
                for s in streams:
                    s.done = True
            if codes.shape[0] != bs:
                raise RuntimeError(f"depth decoder returned {codes} for {bs} streams")  # ok: FC101
            logger.info(f"chunk frame {f}: first stream codes {codes[0]}")  # expect: FC101
            for s in streams:
                s.frames += 1
                s.kv_len += 1
        new_cpu = torch.tensor([s.frames for s in streams], dtype=torch.int64)
        self.frames_emitted_cpu = torch.cat([self.frames_emitted_cpu, new_cpu])  # ok: FC107
        longest = max(self.frames_emitted_cpu)  # ok: FC101
        n_samples = self.pcm_pinned.shape[1]
        self.pcm_pinned[:bs].copy_(self.pcm_ring[:bs, :n_samples], non_blocking=True)  # ok: FC101
        self.copy_done.record()
        for s in streams:
            emitted[s.sid] = s.frames
        emitted[-1] = int(longest)
        return emitted

    def _emit_audio(self) -> None:
        while True:
            self.copy_done.synchronize()
            chunk = self.pcm_pinned.numpy().copy()
            logger.debug("emitted %d samples", chunk.size)
