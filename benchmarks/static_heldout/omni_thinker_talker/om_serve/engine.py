"""The omni serving loop: encoders, thinker step, hidden-state hand-off, talker step."""

from dataclasses import dataclass, field
from typing import List, Optional

import numpy as np
import torch

from omni import HiddenStream, OmniConfig
from om_attn.component import ComponentBatch
from om_attn.encoders import AudioEncoder, VisionEncoder, expand_placeholders
from om_models.talker import TalkerLM
from om_models.thinker import ThinkerLM
from om_serve.pool import GraphPool


@dataclass
class OmniStep:
    input_ids: torch.Tensor
    thinker_batch: ComponentBatch
    talker_batch: ComponentBatch
    audio_features: Optional[torch.Tensor] = None
    audio_feat_lens_cpu: Optional[np.ndarray] = None
    pixels: Optional[torch.Tensor] = None
    grid_thw: Optional[np.ndarray] = None
    pending: List[torch.Tensor] = field(default_factory=list)


def build_component_batch(page_lists: List[List[int]], seq_lens_cpu: np.ndarray, device: torch.device,
                          keep_device_indptr: bool = False,
                          prev_codes: Optional[torch.Tensor] = None) -> ComponentBatch:
    counts = np.array([len(p) for p in page_lists], dtype=np.int32)
    flat = np.concatenate([np.asarray(p, dtype=np.int32) for p in page_lists])
    indptr = np.zeros(len(page_lists) + 1, dtype=np.int32)
    np.cumsum(counts, out=indptr[1:])
    return ComponentBatch(
        batch_size=len(page_lists),
        kv_indices=torch.from_numpy(flat).pin_memory().to(device, non_blocking=True),
        page_counts_cpu=counts,
        seq_lens_cpu=seq_lens_cpu,
        kv_indptr=torch.from_numpy(indptr).to(device) if keep_device_indptr else None,
        prev_codes=prev_codes,
    )


class TalkerRunner:
    def __init__(self, cfg: OmniConfig, talker: TalkerLM, stream: HiddenStream, device: torch.device):
        cc = cfg.talker
        self.cfg = cfg
        self.talker = talker
        self.stream = stream
        self.attn = talker.attn
        self.talker_hidden = torch.zeros(cc.max_batch_size, cfg.thinker.hidden_size, dtype=cc.dtype, device=device)
        self.static_codes = torch.zeros(cc.max_batch_size, dtype=torch.long, device=device)
        self.codec_scratch: Optional[torch.Tensor] = None
        self.pool = GraphPool("talker", self._graph_forward, self.attn, cc.buckets)

    def _graph_forward(self, bs: int) -> torch.Tensor:
        return self.talker(self.talker_hidden[:bs], self.static_codes[:bs], bs)

    def consume(self, slot: int, batch: ComponentBatch) -> torch.Tensor:
        n = batch.batch_size
        if self.talker_hidden.shape[0] < n:
            self.talker_hidden = torch.empty(  # expect: FC107
                n, self.cfg.thinker.hidden_size, dtype=self.cfg.talker.dtype, device=self.talker_hidden.device
            )
        self.talker_hidden[:n].copy_(self.stream.ring_host[slot, :n], non_blocking=True)  # ok: FC101
        self.stream.release(slot)
        self.static_codes[:n].copy_(batch.prev_codes, non_blocking=True)  # ok: FC104
        if batch.new_pages is not None:
            self.attn.bufs["kv_indices"][batch.new_page_pos] = batch.new_pages  # expect: FC104
        if self.codec_scratch is None:
            self.codec_scratch = torch.empty(  # ok: FC107
                self.cfg.talker.max_batch_size, self.cfg.num_codebooks, dtype=torch.long,
                device=self.static_codes.device,
            )
        bs = self.pool.bucket_for(n)
        if bs is None:
            self.attn.plan_eager(batch)
            codes = self.talker(self.talker_hidden[:n], self.static_codes[:n], None)
        else:
            codes = self.pool.replay(bs, batch)[:n]
        self.codec_scratch[:n].copy_(codes)
        return self.codec_scratch[:n]


class OmniEngine:
    def __init__(self, cfg: OmniConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.audio = AudioEncoder(cfg.audio, device)
        self.vision = VisionEncoder(cfg.vision, device, cfg.image_pad_id)
        self.thinker = ThinkerLM(cfg.thinker, device)
        self.talker = TalkerLM(cfg, device)
        th = cfg.thinker
        self.stream = HiddenStream(cfg.stream_slots, th.hidden_size, th.max_batch_size, th.dtype)
        self.thinker_pool = GraphPool("thinker", self.thinker.forward_graph, self.thinker.attn, th.buckets)
        self.talker_runner = TalkerRunner(cfg, self.talker, self.stream, device)

    def make_step(self, input_ids: torch.Tensor, thinker_pages: List[List[int]], thinker_lens: np.ndarray,
                  talker_pages: List[List[int]], talker_lens: np.ndarray, prev_codes: torch.Tensor) -> OmniStep:
        return OmniStep(
            input_ids=input_ids,
            thinker_batch=build_component_batch(thinker_pages, thinker_lens, self.device),
            talker_batch=build_component_batch(talker_pages, talker_lens, self.device, keep_device_indptr=True,
                                               prev_codes=prev_codes),
        )

    def start(self) -> None:
        self.thinker_pool.capture_all()
        self.talker_runner.pool.capture_all()

    def step(self, req: OmniStep):
        if req.audio_features is not None:
            emb = self.audio.encode(req.audio_features, req.audio_feat_lens_cpu)
            req.pending.append(expand_placeholders(self.cfg.audio_pad_id, emb.token_counts))
        if req.pixels is not None:
            _, vision_ids = self.vision.encode(req.pixels, req.grid_thw)
            req.pending.append(vision_ids)
        tb = req.thinker_batch
        n = tb.batch_size
        bs = self.thinker_pool.bucket_for(n)
        if bs is None:
            self.thinker.attn.plan_eager(tb)
            logits, hidden = self.thinker(req.input_ids, None)
        else:
            self.thinker.static_ids[:n].copy_(req.input_ids, non_blocking=True)
            logits, hidden = self.thinker_pool.replay(bs, tb)
            logits, hidden = logits[:n], hidden[:n]
        slot = self.stream.push(hidden)
        codes = self.talker_runner.consume(slot, req.talker_batch)
        return logits.argmax(-1), codes

    def describe(self) -> dict:
        return {
            "thinker": self.thinker_pool.describe(),
            "talker": self.talker_runner.pool.describe(),
            "stream": self.stream._backend,  # ok: FC103
        }
