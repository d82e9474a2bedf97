"""The VLM server: encode or reuse images, prefill text against cached image prefixes, decode in graphs."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch

from vlcache.hashing import image_hash
from vlcache.image_cache import CachedImage, ImageKVCache
from vlcache.pool import PagePool
from vl_model.attention import VLAttentionBackend
from vl_model.config import VLConfig
from vl_model.encoder import VisionConfig, VisionEncoder
from vl_model.metadata import VLBatch, VLRequestView
from vl_model.model import VLModel
from vl_server.graph_runner import DecodeGraphRunner

logger = logging.getLogger(__name__)


@dataclass
class ImageInput:
    pixels: torch.Tensor  # [3, H, W], preprocessed
    raw: bytes
    size: Tuple[int, int]


@dataclass
class ServerRequest:
    req_id: int
    prompt_ids: List[int]
    images: List[ImageInput]
    max_new_tokens: int
    image_hashes: List[str] = field(default_factory=list)
    entries: List[CachedImage] = field(default_factory=list)
    text_pages: List[int] = field(default_factory=list)
    num_computed: int = 0
    output: List[int] = field(default_factory=list)
    rope_delta: int = 0

    @property
    def tokens(self) -> List[int]:
        return self.prompt_ids + self.output


class VLServer:
    def __init__(self, cfg: VLConfig, vcfg: VisionConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.pool = PagePool(cfg.num_pages)
        self.cache = ImageKVCache(self.pool, cfg.page_size, cfg.max_cached_images, device)
        self.encoder = VisionEncoder(vcfg).to(device=device, dtype=cfg.dtype)
        self.backend = VLAttentionBackend(cfg, self.cache, device)
        self.model = VLModel(cfg, self.backend, device).to(device=device, dtype=cfg.dtype)
        self.graphs = DecodeGraphRunner(self.model, self.backend, cfg, device)
        self.running: Dict[int, ServerRequest] = {}

    def start(self) -> None:
        impl = self.encoder._backend  # ok: FC103
        logger.info("vision attention: %s; %d decode buckets", impl, len(self.graphs.buckets))
        cold = self.backend.cold_wrappers()
        if cold:
            logger.info("first prefill will JIT-compile %s", ", ".join(type(w).__name__ for w in cold))
        self.graphs.capture_all()

    # -- admission: encode misses, reuse hits ---------------------------------------------------------

    def _reserve(self, n_pages: int) -> List[int]:
        pages = self.pool.alloc(n_pages)
        if pages is None:
            self.cache.evict_lru(n_pages)
            pages = self.pool.alloc(n_pages)
        if pages is None:
            mapping = self.pool.compact()
            self._apply_compaction(mapping)
            pages = self.pool.alloc(n_pages)
        if pages is None:
            raise MemoryError(f"cannot reserve {n_pages} pages with {self.pool.num_free} free after eviction")
        return pages

    def _apply_compaction(self, mapping: np.ndarray) -> None:
        old = np.flatnonzero(mapping != np.arange(len(mapping)))
        if old.size:
            src = torch.from_numpy(old).to(self.device)
            dst = torch.from_numpy(mapping[old].astype(np.int64)).to(self.device)
            self.model.kv_cache[:, dst] = self.model.kv_cache[:, src]
        self.cache.remap(mapping)
        for r in self.running.values():
            r.text_pages = [int(mapping[p]) for p in r.text_pages]
        self.backend.remap_pages(torch.from_numpy(mapping).to(self.device))

    def _encode_and_cache(self, img: ImageInput, key: str) -> CachedImage:
        with torch.inference_mode():
            embeds, mask = self.encoder(img.pixels.to(self.device, dtype=self.cfg.dtype))
        n = embeds.shape[0]
        pages = self._reserve(n // self.cfg.page_size)
        entry = self.cache.insert(key, pages, n, mask, embeds)
        self._prefill_image(entry)
        return entry

    def _prefill_image(self, entry: CachedImage) -> None:
        """Write the image tokens' KV into the entry's pages (a prefill with no prefix)."""
        view = VLRequestView(req_id=-1, image_hashes=[], num_computed=0, num_new=entry.num_tokens,
                             text_pages=entry.page_ids)
        batch = VLBatch(is_decode=False, reqs=[view], input_ids_np=np.zeros(entry.num_tokens, dtype=np.int64))
        self.backend.init_forward_metadata(batch)
        pos = torch.arange(entry.num_tokens, device=self.device)
        pages = entry.pages_dev.long().repeat_interleave(self.cfg.page_size)
        offs = torch.arange(self.cfg.page_size, device=self.device).repeat(entry.num_pages)
        self.model.forward_extend(pos, pos.expand(3, -1), pages, offs, embeds=entry.embeds)

    def admit(self, req: ServerRequest) -> None:
        for img in req.images:
            key = image_hash(img.raw, img.size)
            entry = self.cache.lookup(key) or self._encode_and_cache(img, key)
            self.cache.pin(entry)
            req.image_hashes.append(key)
            req.entries.append(entry)
        req.text_pages = self._reserve(-(-(len(req.prompt_ids) + req.max_new_tokens) // self.cfg.page_size))
        self.running[req.req_id] = req

    def finish(self, req_id: int) -> None:
        req = self.running.pop(req_id)
        for e in req.entries:
            self.cache.unpin(e)
        self.pool.decref(req.text_pages)

    # -- steps -------------------------------------------------------------------------------------------

    def _views(self, reqs: List[ServerRequest], decode: bool) -> List[VLRequestView]:
        out = []
        for r in reqs:
            n_new = 1 if decode else len(r.prompt_ids) - r.num_computed
            out.append(VLRequestView(r.req_id, r.image_hashes, r.num_computed, n_new, r.text_pages, r.rope_delta))
        return out

    def _slots(self, views: List[VLRequestView]) -> Tuple[torch.Tensor, torch.Tensor]:
        ps = self.cfg.page_size
        toks = [(v.text_pages[t // ps], t % ps) for v in views for t in range(v.num_computed, v.text_kv_len)]
        arr = np.asarray(toks, dtype=np.int64).reshape(-1, 2)
        dev = torch.from_numpy(arr).to(self.device, non_blocking=True)
        return dev[:, 0], dev[:, 1]

    def step(self) -> int:
        prefill = [r for r in self.running.values() if r.num_computed < len(r.prompt_ids)]
        if prefill:
            views = self._views(prefill, decode=False)
            ids = np.concatenate([np.asarray(r.tokens[r.num_computed:], dtype=np.int64) for r in prefill])
            batch = VLBatch(False, views, ids, image_rows=sum(1 for r in prefill if r.entries))
            self.backend.init_forward_metadata(batch)
            meta = self.backend.forward_metadata
            pages, offs = self._slots(views)
            logits = self.model.forward_extend(torch.from_numpy(ids).to(self.device), meta.positions, pages, offs)
            for r in prefill:
                r.num_computed = len(r.prompt_ids)
            self._emit(prefill, logits)
            return len(prefill)

        reqs = list(self.running.values())
        if not reqs:
            return 0
        views = self._views(reqs, decode=True)
        ids = np.asarray([r.tokens[-1] for r in reqs], dtype=np.int64)
        batch = VLBatch(True, views, ids, image_rows=sum(1 for r in reqs if r.entries))
        pos_np = np.asarray([r.num_computed for r in reqs], dtype=np.int64)
        ids_d = torch.from_numpy(ids).to(self.device, non_blocking=True)
        pos_d = torch.from_numpy(np.broadcast_to(pos_np, (3, len(reqs))).copy()).to(self.device, non_blocking=True)
        delta_d = torch.from_numpy(
            np.broadcast_to(np.asarray([r.rope_delta for r in reqs], dtype=np.int64), (3, len(reqs))).copy()
        ).to(self.device, non_blocking=True)
        pages, offs = self._slots(views)
        seq_d = torch.from_numpy(pos_np.astype(np.int32) + 1).to(self.device, non_blocking=True)
        if self.graphs.bucket_for(len(reqs)) is not None:
            logits = self.graphs.replay(batch, ids_d, pos_d, delta_d, pages, offs, seq_d)
        else:
            self.backend.init_forward_metadata(batch)
            logits = self.model.forward_decode(ids_d, pos_d, delta_d, pages, offs)
        for r in reqs:
            r.num_computed += 1
        self._emit(reqs, logits)
        return len(reqs)

    def _emit(self, reqs: List[ServerRequest], logits: torch.Tensor) -> None:
        last = logits if logits.shape[0] == len(reqs) else logits[self._last_rows(reqs)]
        tokens = last.argmax(dim=-1).cpu().tolist()
        for r, t in zip(reqs, tokens):
            r.output.append(t)
        logger.debug("emitted %d tokens, %d cached images", len(tokens), len(self.cache))

    def _last_rows(self, reqs: List[ServerRequest]) -> torch.Tensor:
        lens = np.asarray([len(r.prompt_ids) for r in reqs], dtype=np.int64)
        return torch.from_numpy(np.cumsum(lens) - 1).to(self.device)

    def cached_image(self, key: str) -> Optional[CachedImage]:
        return self.cache.lookup(key)
