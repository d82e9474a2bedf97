from __future__ import annotations

import logging
import queue
from collections import deque
from dataclasses import dataclass

import numpy as np
import torch

from cfgserve.attention.backend import PairAttnBackend
from cfgserve.batch import DecodeBatch, PromptBatch
from cfgserve.config import GenConfig
from cfgserve.graph_runner import PairGraphRunner
from cfgserve.model import ImageARModel
from cfgserve.pairs import PairTable, RowPair
from cfgserve.sampling.cfg import CFGSampler

logger = logging.getLogger(__name__)


@dataclass
class GenRequest:
    req_id: str
    prompt_ids: list[int]
    uncond_ids: list[int]  # "<bos><img_start>" or a negative prompt
    guidance: float = 5.0
    temperature: float = 1.0


class ImageGenEngine:
    def __init__(self, cfg: GenConfig):
        self.cfg = cfg
        self.device = torch.device(cfg.device)
        self.pairs = PairTable(cfg)
        self.backend = PairAttnBackend(cfg, self.pairs)
        self.model = ImageARModel(cfg, self.backend).to(device=self.device, dtype=torch.bfloat16)
        self.sampler = CFGSampler(cfg, self.backend)
        self.graphs = PairGraphRunner(cfg, self.model, self.backend, self.sampler)
        self.graphs.record_all()
        self.waiting: deque[GenRequest] = deque()
        self.running: dict[str, RowPair] = {}
        self.image_codes = torch.zeros(cfg.max_pairs, cfg.image_tokens, dtype=torch.int64, device=self.device)
        self.last_ids = torch.zeros(cfg.max_pairs, dtype=torch.int64, device=self.device)
        self.tokens_pinned = torch.zeros(cfg.max_pairs, dtype=torch.int64, pin_memory=True)
        self.vq_queue: queue.Queue = queue.Queue()

    def add_request(self, req: GenRequest) -> None:
        self.waiting.append(req)

    # ---- prefill ------------------------------------------------------------------------
    def _admit(self) -> list[tuple[GenRequest, RowPair]]:
        admitted = []
        while self.waiting:
            req = self.waiting[0]
            pair = self.pairs.add(req.req_id, len(req.prompt_ids), len(req.uncond_ids), req.guidance, req.temperature)
            if pair is None:
                break
            self.waiting.popleft()
            self.running[req.req_id] = pair
            admitted.append((req, pair))
        return admitted

    def _prefill(self, admitted: list[tuple[GenRequest, RowPair]]) -> None:
        cond = [r.prompt_ids for r, _ in admitted]
        uncond = [r.uncond_ids for r, _ in admitted]
        seqs = cond + uncond
        slots = np.array([p.slot for _, p in admitted], dtype=np.int64)
        rows = self.pairs.rows_of(slots)
        ids = np.concatenate([np.asarray(s, dtype=np.int64) for s in seqs])
        pos = np.concatenate([np.arange(len(s)) for s in seqs])
        row_of_tok = np.repeat(rows, [len(s) for s in seqs])
        pages = self.pairs.page_table_np[row_of_tok, pos // self.cfg.page_size]
        slot_map = pages.astype(np.int64) * self.cfg.page_size + pos % self.cfg.page_size
        ends = np.cumsum([len(s) for s in seqs]) - 1
        pb = PromptBatch(
            req_ids=[r.req_id for r, _ in admitted],
            slots_np=slots,
            cond_lens_np=np.array([len(s) for s in cond], dtype=np.int32),
            uncond_lens_np=np.array([len(s) for s in uncond], dtype=np.int32),
            input_ids=torch.from_numpy(ids).to(self.device, non_blocking=True),
            positions=torch.from_numpy(pos).to(self.device, non_blocking=True),
            slot_mapping=torch.from_numpy(slot_map).to(self.device, non_blocking=True),
            last_token_idx=torch.from_numpy(ends).to(self.device, non_blocking=True),
        )
        meta = self.backend.plan_prompts(pb)
        hidden = self.model.prefill(pb.input_ids, pb.positions, meta)
        logits = self.model.image_logits(hidden[pb.last_token_idx])
        n = len(admitted)
        scales = torch.tensor([r.guidance for r, _ in admitted], device=self.device)
        guided = logits[n:] + scales[:, None] * (logits[:n] - logits[n:])
        first = guided.argmax(dim=-1)
        slots_gpu = torch.from_numpy(slots).to(self.device, non_blocking=True)
        self.last_ids[slots_gpu] = first
        self.image_codes[slots_gpu, 0] = first
        self.pairs.generated_np[slots] = 1

    # ---- decode -------------------------------------------------------------------------
    def _decode_batch(self) -> DecodeBatch:
        pairs = list(self.running.values())
        slots = np.array([p.slot for p in pairs], dtype=np.int64)
        uncond_rows = slots + self.pairs.max_pairs
        steps = self.pairs.generated_np[slots].astype(np.int64)
        cond_pos = self.pairs.seq_len_np[slots].astype(np.int64)
        uncond_pos = self.pairs.seq_len_np[uncond_rows].astype(np.int64)
        rows = np.concatenate([slots, uncond_rows])
        all_pos = np.concatenate([cond_pos, uncond_pos])
        pages = self.pairs.page_table_np[rows, all_pos // self.cfg.page_size].astype(np.int64)
        slot_map = pages * self.cfg.page_size + all_pos % self.cfg.page_size
        self.pairs.seq_len_np[rows] += 1
        slots_gpu = torch.from_numpy(slots).to(self.device, non_blocking=True)
        ids = self.last_ids[slots_gpu]
        temps = np.array([p.temperature for p in pairs], dtype=np.float32)
        return DecodeBatch(
            req_ids=[p.req_id for p in pairs],
            num_pairs=len(pairs),
            slots_np=slots,
            slots_gpu=slots_gpu,
            steps_np=steps,
            steps_gpu=torch.from_numpy(steps).to(self.device, non_blocking=True),
            guidance_np=np.array([p.guidance for p in pairs], dtype=np.float32),
            temperature_np=temps,
            greedy_mask_gpu=torch.from_numpy(temps == 0.0).to(self.device, non_blocking=True),
            cond_input_ids=ids,
            uncond_input_ids=ids,
            cond_positions=torch.from_numpy(cond_pos).to(self.device, non_blocking=True),
            uncond_positions=torch.from_numpy(uncond_pos).to(self.device, non_blocking=True),
            slot_mapping=torch.from_numpy(slot_map).to(self.device, non_blocking=True),
        )

    def _clear_graph_rows(self, row: int) -> None:
        """A retired pair's pages go back to the pool: padded graph rows must not keep
        reading them."""
        b = self.backend
        start, end = int(b.cond_kv_indptr_np[row]), int(b.cond_kv_indptr_np[row + 1])
        b.cond_kv_indices[start:end].fill_(0)  # expect: FC104
        b.cond_last_page_len_cpu[row] = 1  # ok: FC104

    def _retire(self, batch: DecodeBatch) -> None:
        for row, (rid, slot) in enumerate(zip(batch.req_ids, batch.slots_np)):
            if self.pairs.generated_np[slot] < self.cfg.image_tokens:
                continue
            self._clear_graph_rows(row)
            self.vq_queue.put((rid, self.image_codes[slot].clone()))
            self.pairs.release(rid)
            del self.running[rid]

    def step(self) -> None:
        admitted = self._admit()
        if admitted:
            self._prefill(admitted)
        if not self.running:
            return
        batch = self._decode_batch()
        n = batch.num_pairs
        self.sampler.set_scales(batch)
        bs = self.graphs.bucket(n)
        if bs is not None:
            self.backend.prepare_pairs_for_replay(bs, batch)
            logits, guided = self.graphs.replay(bs, batch)
            cond_logits = logits[:n]
        else:
            meta = self.backend.plan_decode_eager(batch)
            ids = torch.cat([batch.cond_input_ids, batch.uncond_input_ids])
            pos = torch.cat([batch.cond_positions, batch.uncond_positions])
            logits = self.model.image_logits(self.model.decode(ids, pos, meta))
            guided = self.sampler.mix_eager(logits, batch)
            cond_logits = logits[:n]
        ids = self.sampler.sample(guided, cond_logits, batch)
        self.image_codes[batch.slots_gpu, batch.steps_gpu] = ids
        self.last_ids[batch.slots_gpu] = ids
        # streaming previews read the newest code of every pair
        self.tokens_pinned[:n].copy_(ids)  # expect: FC101
        self.pairs.generated_np[batch.slots_np] += 1
        n_done = int((self.pairs.generated_np[batch.slots_np] >= self.cfg.image_tokens).sum())  # ok: FC101
        if n_done:
            self._retire(batch)
