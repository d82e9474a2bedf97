"""The streaming engine: frame chunks are encoded and appended to each stream's KV as they
arrive, frames are evicted past the visual-token budget, and answers decode in between."""
from typing import List

import torch

from vs_attn.backend import VideoLMBackend
from vs_vision.encoder import VisionEncoder, VisionGraphRunner
from vstream import FrameChunk, FrameEvictionPolicy, FrameQueue, VideoStreamConfig

from .lm import LMGraphRunner, VideoLM


class StreamingVideoEngine:
    def __init__(self, cfg: VideoStreamConfig):
        self.cfg = cfg
        self.device = torch.device(cfg.device)
        self.backend = VideoLMBackend(cfg, self.device)
        self.policy = FrameEvictionPolicy(cfg, graph_indices=self.backend.kv_indices_buf, device=self.device)
        self.vision = VisionGraphRunner(VisionEncoder(cfg, cfg.frame_buckets).to(self.device), cfg, self.device)
        self.lm = VideoLM(cfg, self.backend).to(self.device)
        self.lm_graphs = LMGraphRunner(self.lm, self.backend, cfg, self.device)
        self.kv_caches = [
            torch.zeros(cfg.num_pages, 2, cfg.num_kv_heads, cfg.page_size, cfg.head_dim, dtype=torch.bfloat16, device=self.device)
            for _ in range(cfg.num_layers)
        ]
        self.free_pages: List[int] = list(range(cfg.num_pages))
        self.last_frame_feat = torch.zeros(cfg.max_streams, cfg.hidden_size, device=self.device)
        self.vision_stream = torch.cuda.Stream()
        self.queue = FrameQueue(max(cfg.frame_buckets))
        self.answering: List[int] = []
        max_bs = max(cfg.decode_buckets)
        self.next_ids = torch.zeros(max_bs, dtype=torch.int64, device=self.device)
        self.answer_host = torch.zeros(max_bs, dtype=torch.int64, pin_memory=True)
        self.answer_event = torch.cuda.Event()

    def warmup(self) -> None:
        self.backend.init_decode_buffers()
        for nf in self.cfg.frame_buckets:
            self.vision.record_bucket(nf)
        for bs in self.cfg.decode_buckets:
            self.lm_graphs.record(bs, self.kv_caches)

    def _alloc(self, n: int) -> List[int]:
        if n > len(self.free_pages):
            raise MemoryError(f"{n} pages wanted, {len(self.free_pages)} free; reclaim() runs between ticks")
        pages, self.free_pages = self.free_pages[:n], self.free_pages[n:]
        return pages

    def reclaim(self) -> None:
        """Return pages freed by eviction to the host allocator (the server calls it between ticks)."""
        self.free_pages.extend(self.policy.free_ring[: self.policy.free_head].tolist())
        self.policy.free_head = 0

    def ingest_chunk(self, chunk: FrameChunk) -> None:
        sid, nf = chunk.stream_id, chunk.num_frames
        t, p = self.cfg.tokens_per_frame, self.cfg.pages_per_frame
        if nf > self.vision.static_pixels.shape[0]:
            # a chunk past the largest bucket (the queue's check is gone under -O)
            self.vision.static_pixels = torch.empty(  # expect: FC107
                (nf, *self.vision.static_pixels.shape[1:]), dtype=torch.bfloat16, device=self.device
            )
        with torch.cuda.stream(self.vision_stream):
            feats = self.vision.encode(chunk.pixels_cpu)
        torch.cuda.current_stream().wait_stream(self.vision_stream)  # ok: FC101
        # drop frames that repeat the previous one (a static scene)
        sim = (feats.mean(1) * self.last_frame_feat[sid]).sum(-1)
        feats = feats[sim < self.cfg.dup_threshold]  # expect: FC101
        k = feats.shape[0]
        if k == 0:
            return
        self.last_frame_feat[sid].copy_(feats[-1].mean(0))
        chunk.embeds = feats.flatten(0, 1).clone()  # ok: FC107
        pages = torch.tensor(self._alloc(k * p), dtype=torch.int32, device=self.device).view(k, p)
        self.policy.add_frames(sid, pages, k * t)
        view = self.policy.kv_view([sid], pad_to=1)
        qo_indptr = torch.tensor([0, k * t], dtype=torch.int32, device=self.device)
        self.backend.plan_ingest(qo_indptr, view)
        self.lm.ingest(chunk.embeds, self.kv_caches)
        self.policy.evict(sid)

    def ask(self, sid: int, question: List[int]) -> None:
        n_pages = -(-len(question) // self.cfg.page_size)
        self.policy.add_text(sid, self._alloc(n_pages), len(question))
        view = self.policy.kv_view([sid], pad_to=1)
        self.backend.plan_ingest(torch.tensor([0, len(question)], dtype=torch.int32), view)
        self.lm.ingest(self.lm.embed(torch.tensor(question, device=self.device)), self.kv_caches)
        self.answering.append(sid)

    def answer_step(self) -> None:
        n = len(self.answering)
        if n == 0:
            return
        bs = min(b for b in self.cfg.decode_buckets if b >= n)
        for sid in self.answering:
            new_page = self.policy.text_len_np[sid] % self.cfg.page_size == 0
            self.policy.add_text(sid, self._alloc(1) if new_page else [], 1)
        view = self.policy.kv_view(self.answering, pad_to=bs)
        self.backend.prepare_decode(bs, view)
        logits = self.lm_graphs.replay(bs, n, self.next_ids[:n])
        torch.argmax(logits, dim=-1, out=self.next_ids[:n])
        self.answer_host[:n].copy_(self.next_ids[:n], non_blocking=True)
        self.answer_event.record()

    def drain_answers(self) -> List[int]:
        self.answer_event.synchronize()
        return self.answer_host[: len(self.answering)].tolist()

    def capture_stats(self) -> List[List[float]]:
        return [scores[:8].tolist() for scores in self.policy.frame_scores]  # ok: FC101
