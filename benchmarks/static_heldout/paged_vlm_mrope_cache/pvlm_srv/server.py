"""The multi-turn VLM server: admission, one prefill-or-decode step at a time, async output."""
from __future__ import annotations

import collections
import queue
import threading
from dataclasses import dataclass, field
from typing import Deque, Dict, List, Optional

import flashinfer
import numpy as np
import torch

from pvlm.config import VLMConfig
from pvlm.tools.mrope import ActiveRequest, MRopePositionComputer, Segment, StepBatch
from pvlm.vision.encoder_cache import ImageEmbeddingCache, VisionPreprocessor
from pvlm.vision.tower import VisionTower
from pvlm_srv.attention import DecodeMeta, PrefillMeta, VLMAttention
from pvlm_srv.graphs import DecodeGraphPool
from pvlm_srv.model import VLMDecoder


@dataclass
class Conversation:
    conv_id: int
    slot: int
    seq_len: int = 0
    page_ids: List[int] = field(default_factory=list)
    image_page_ids: List[int] = field(default_factory=list)


class ConversationStore:
    """Pages stay with their conversation between turns; page 0 is the null page of padded rows."""

    def __init__(self, cfg: VLMConfig, attn: VLMAttention, model: VLMDecoder):
        self.cfg, self.attn, self.model = cfg, attn, model
        self.free_pages: Deque[int] = collections.deque(range(1, cfg.num_pages))
        self.free_image_pages: Deque[int] = collections.deque(range(cfg.num_image_pages))
        self.free_slots: Deque[int] = collections.deque(range(cfg.max_num_seqs))
        self.convs: Dict[int, Conversation] = {}

    def admit(self, conv_id: int, tokens: List[int], segments: List[Segment], max_new_tokens: int) -> ActiveRequest:
        conv = self.convs.get(conv_id)
        if conv is None:
            conv = self.convs[conv_id] = Conversation(conv_id, self.free_slots.popleft())
        ps = self.cfg.page_size
        need = (conv.seq_len + len(tokens) + max_new_tokens + ps - 1) // ps - len(conv.page_ids)
        if need > len(self.free_pages):
            raise RuntimeError(f"out of KV pages: need {need}, {len(self.free_pages)} free")
        conv.page_ids.extend(self.free_pages.popleft() for _ in range(max(0, need)))
        return ActiveRequest(conv_id, conv.slot, tokens, segments, conv.seq_len, max_new_tokens,
                             conv.page_ids, conv.image_page_ids)

    def _retain_images(self, req: ActiveRequest, turn_start: int) -> None:
        # copy the pages holding this turn's image tokens into the conversation's image pool
        ps, pos, src = self.cfg.page_size, turn_start, []
        for seg in req.segments:
            if seg.kind == "image":
                src.extend(req.page_ids[pos // ps : (pos + seg.length - 1) // ps + 1])
            pos += seg.length
        if not src or len(src) > len(self.free_image_pages):
            return
        dst = [self.free_image_pages.popleft() for _ in src]
        req.image_page_ids.extend(dst)
        src_t, dst_t = (torch.tensor(x, dtype=torch.int64, device=self.attn.device) for x in (src, dst))
        for (k, v), (ik, iv) in zip(self.model.kv_caches, self.model.img_kv_caches):
            ik[dst_t], iv[dst_t] = k[src_t], v[src_t]

    def release(self, req: ActiveRequest, turn_start: int) -> None:
        conv = self.convs[req.conv_id]
        conv.seq_len = req.seq_len
        self._retain_images(req, turn_start)
        if req.graph_span is not None:
            # the bucket graphs still point at this request's pages; park its rows on the null page
            start, end = req.graph_span
            self.attn.kv_indices_buf[start:end].zero_()  # expect: FC104


class VLMServer:
    def __init__(self, cfg: VLMConfig, eos_id: int, device: str = "cuda"):
        self.cfg, self.eos_id, self.device = cfg, eos_id, torch.device(device)
        self.preproc = VisionPreprocessor(cfg, self.device)
        self.vision = VisionTower(cfg, self.device).to(self.device, cfg.dtype)
        self.image_cache = ImageEmbeddingCache(cfg, self.device)
        self.mrope = MRopePositionComputer(cfg, self.device)
        self.attn = VLMAttention(cfg, self.device)
        self.attn.init_decode_buffers()
        self.model = VLMDecoder(cfg, self.attn).to(self.device, cfg.dtype)
        self.model.allocate_kv(self.device)
        self.graphs = DecodeGraphPool(self.model, self.attn, cfg, self.device)
        self.store = ConversationStore(cfg, self.attn, self.model)
        self.waiting: Deque[ActiveRequest] = collections.deque()
        self.running: List[ActiveRequest] = []
        self.turn_start: Dict[int, int] = {}
        self.last_tokens_gpu = torch.zeros(cfg.max_num_seqs, dtype=torch.int64, device=self.device)
        self.top_k = torch.full((cfg.max_num_seqs,), 50, dtype=torch.int32, device=self.device)
        self.top_p = torch.full((cfg.max_num_seqs,), 0.9, dtype=torch.float32, device=self.device)
        self.out_pinned = torch.zeros(4, cfg.max_num_seqs, dtype=torch.int64, pin_memory=True)
        self.events = [torch.cuda.Event() for _ in range(4)]
        self.out_queue, self.finished_queue = queue.Queue(), queue.Queue()
        self.output_thread = threading.Thread(target=self._output_loop, daemon=True)
        self.step_id = 0

    def start(self) -> None:
        self.graphs.warm_up(self._dummy_decode_meta)
        self.output_thread.start()

    def submit_turn(self, conv_id: int, text_ids: List[List[int]], images: List[np.ndarray], max_new_tokens: int = 512) -> None:
        """``text_ids[i]`` precedes ``images[i]``; one trailing text piece follows the last image."""
        if len(text_ids) != len(images) + 1:
            raise ValueError(f"{len(text_ids)} text pieces for {len(images)} images; expected one more text piece")
        tokens: List[int] = []
        segments: List[Segment] = []
        for i, piece in enumerate(text_ids):
            tokens.extend(piece)
            segments.append(Segment("text", len(piece)))
            if i < len(images):
                mm = self.preproc.preprocess(images[i])
                tokens.extend([self.cfg.image_token_id] * mm.num_tokens)
                segments.append(Segment("image", mm.num_tokens, mm))
        req = self.store.admit(conv_id, tokens, segments, max_new_tokens)
        self.turn_start[conv_id] = req.seq_len
        self.waiting.append(req)

    def _dummy_decode_meta(self, bs: int) -> DecodeMeta:
        dev = self.device
        return DecodeMeta(
            num_reqs=bs, num_pages=bs, input_ids=torch.zeros(bs, dtype=torch.int64, device=dev),
            kv_indptr_host=torch.arange(bs + 1, dtype=torch.int32),
            kv_indices=torch.zeros(bs, dtype=torch.int32, device=dev),
            last_page_len_host=torch.ones(bs, dtype=torch.int32),
            img_kv_indptr_host=torch.zeros(bs + 1, dtype=torch.int32),
            img_kv_indices=torch.zeros(0, dtype=torch.int32, device=dev),
            img_last_page_len_host=torch.zeros(bs, dtype=torch.int32),
            slot_mapping=torch.zeros(bs, dtype=torch.int64, device=dev),
        )

    def _schedule(self) -> Optional[StepBatch]:
        batch = StepBatch()
        budget = self.cfg.max_prefill_tokens
        while self.waiting and len(self.waiting[0].tokens) <= budget:
            if len(self.running) + len(batch.prefills) >= self.cfg.max_num_seqs:
                break
            req = self.waiting.popleft()
            budget -= len(req.tokens)
            batch.prefills.append(req)
        if batch.prefills:
            return batch
        return StepBatch(decodes=list(self.running)) if self.running else None

    def _page_tables(self, reqs: List[ActiveRequest], new_tokens: List[int]):
        ps = self.cfg.page_size
        n = len(reqs)
        kv_indptr, img_indptr = np.zeros(n + 1, dtype=np.int32), np.zeros(n + 1, dtype=np.int32)
        last_page_len, img_last = np.zeros(n, dtype=np.int32), np.zeros(n, dtype=np.int32)
        pages: List[int] = []
        img_pages: List[int] = []
        slots: List[int] = []
        for i, (r, k) in enumerate(zip(reqs, new_tokens)):
            kv_len = r.seq_len + k
            npg = (kv_len + ps - 1) // ps
            pages.extend(r.page_ids[:npg])
            kv_indptr[i + 1] = kv_indptr[i] + npg
            last_page_len[i] = kv_len - (npg - 1) * ps
            img_pages.extend(r.image_page_ids)
            img_indptr[i + 1] = img_indptr[i] + len(r.image_page_ids)
            img_last[i] = ps if r.image_page_ids else 0
            slots.extend(r.page_ids[p // ps] * ps + p % ps for p in range(r.seq_len, kv_len))
        dev = self.device
        return dict(
            kv_indptr_host=torch.from_numpy(kv_indptr),
            kv_indices=torch.tensor(pages, dtype=torch.int32, device=dev),
            last_page_len_host=torch.from_numpy(last_page_len),
            img_kv_indptr_host=torch.from_numpy(img_indptr),
            img_kv_indices=torch.tensor(img_pages, dtype=torch.int32, device=dev),
            img_last_page_len_host=torch.from_numpy(img_last),
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=dev),
        ), kv_indptr

    def _run_prefill(self, batch: StepBatch, positions: torch.Tensor) -> torch.Tensor:
        reqs = batch.prefills
        lens = [len(r.tokens) for r in reqs]
        tables, _ = self._page_tables(reqs, lens)
        qo = np.zeros(len(reqs) + 1, dtype=np.int32)
        qo[1:] = np.cumsum(lens)
        kv_lens = np.array([r.seq_len + k for r, k in zip(reqs, lens)], dtype=np.int32)
        cu_kv = np.concatenate([[0], np.cumsum(kv_lens)]).astype(np.int32)
        ids = np.concatenate([np.asarray(r.tokens, dtype=np.int64) for r in reqs])
        block_tables = torch.zeros(len(reqs), self.cfg.max_pages_per_seq, dtype=torch.int32)
        for i, r in enumerate(reqs):
            block_tables[i, : len(r.page_ids)] = torch.tensor(r.page_ids, dtype=torch.int32)
        meta = PrefillMeta(
            num_tokens=int(qo[-1]),
            input_ids=torch.from_numpy(ids).to(self.device, non_blocking=True),
            qo_indptr=torch.from_numpy(qo).to(self.device, non_blocking=True),
            qo_indptr_host=torch.from_numpy(qo),
            last_token_idx=torch.from_numpy(qo[1:] - 1).to(self.device, dtype=torch.int64),
            block_tables=block_tables.to(self.device, non_blocking=True),
            seq_lens=torch.from_numpy(kv_lens).to(self.device, non_blocking=True),
            cu_kv_lens=torch.from_numpy(cu_kv).to(self.device, non_blocking=True),
            max_kv_len=int(kv_lens.max()),
            **tables,
        )
        self.attn.prepare_prefill(meta)
        embeds = self.model.embed(meta.input_ids)
        hashes = [seg.mm.image_hash for r in reqs for seg in r.segments if seg.mm is not None]
        if hashes:
            image_embeds = self.image_cache.gather(hashes)
            is_image = meta.input_ids == self.cfg.image_token_id
            n_image = int(is_image.sum())  # expect: FC101
            if n_image != image_embeds.shape[0]:
                raise ValueError(f"{n_image} image placeholders but {image_embeds.shape[0]} image embeddings")
            embeds = embeds.masked_scatter(is_image.unsqueeze(-1), image_embeds.to(embeds.dtype))  # ok: FC101
        return self.model.forward_prefill(embeds, positions, meta.slot_mapping, meta.last_token_idx)

    def _run_decode(self, batch: StepBatch, positions: torch.Tensor) -> torch.Tensor:
        reqs = batch.decodes
        n = len(reqs)
        tables, kv_indptr = self._page_tables(reqs, [1] * n)
        for i, r in enumerate(reqs):
            r.graph_span = (int(kv_indptr[i]), int(kv_indptr[i + 1]))
        slots = torch.tensor([r.slot for r in reqs], dtype=torch.int64, device=self.device)
        meta = DecodeMeta(num_reqs=n, num_pages=int(kv_indptr[n]), input_ids=self.last_tokens_gpu[slots], **tables)
        bs = self.graphs.bucket(n)
        self.attn.prepare_decode(n if bs is None else bs, meta)
        if bs is None:
            return self.model.decode(meta.input_ids, positions, meta.slot_mapping, n)
        return self.graphs.replay(bs, meta.input_ids, positions, meta.slot_mapping)

    def serve_step(self) -> None:
        while not self.finished_queue.empty():
            req = self.finished_queue.get_nowait()
            self.running.remove(req)
            self.store.release(req, self.turn_start.pop(req.conv_id))
        batch = self._schedule()
        if batch is None:
            return
        for req in batch.prefills:
            for seg in req.segments:
                if seg.mm is not None and not self.image_cache.contains(seg.mm.image_hash):
                    self.image_cache.insert(seg.mm.image_hash, self.vision.encode(seg.mm))
        positions = self.mrope.compute(batch)
        logits = self._run_prefill(batch, positions) if batch.prefills else self._run_decode(batch, positions)
        reqs = batch.prefills or batch.decodes
        n = len(reqs)
        next_ids = flashinfer.sampling.top_k_top_p_sampling_from_logits(logits, self.top_k[:n], self.top_p[:n])
        slots = torch.tensor([r.slot for r in reqs], dtype=torch.int64, device=self.device)
        self.last_tokens_gpu.index_copy_(0, slots, next_ids)
        ring = self.step_id % 4
        self.out_pinned[ring, :n].copy_(next_ids, non_blocking=True)
        self.events[ring].record()
        for r in reqs:
            r.seq_len += len(r.tokens) if r.tokens else 1
            r.tokens = []
        self.running.extend(batch.prefills)
        self.out_queue.put((ring, reqs))
        self.step_id += 1

    def _output_loop(self) -> None:
        produced: Dict[int, int] = collections.defaultdict(int)
        while True:
            ring, reqs = self.out_queue.get()
            self.events[ring].synchronize()
            for r, tok in zip(reqs, self.out_pinned[ring, : len(reqs)].tolist()):
                produced[r.conv_id] += 1
                if tok == self.eos_id or produced[r.conv_id] >= r.max_new_tokens:
                    self.finished_queue.put(r)
                    del produced[r.conv_id]
