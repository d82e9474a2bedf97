from __future__ import annotations

import logging
import queue
from typing import Dict, List

import numpy as np
import torch

from wmserve.attention import DecodeAttention
from wmserve.config import EngineLimits, WatermarkConfig
from wmserve.graph_pool import DecodeGraphPool
from wmserve.model import DecoderLM
from wmserve.step import PrefillInputs, Request, StepInputs
from wmserve.watermark.detector import WatermarkDetector
from wmserve.watermark.greenlist import GreenListBias, GreenListTable

logger = logging.getLogger(__name__)


class WatermarkEngine:
    def __init__(self, wm: WatermarkConfig, limits: EngineLimits, device: str = "cuda"):
        self.wm = wm
        self.limits = limits
        self.device = torch.device(device)
        self.attn = DecodeAttention(limits, self.device)
        shape = (limits.num_pages, 2, limits.page_size, limits.num_kv_heads, limits.head_dim)
        self.attn.kv_cache = [torch.zeros(shape, dtype=torch.bfloat16, device=self.device)
                              for _ in range(limits.num_layers)]
        self.model = DecoderLM(limits, self.attn).to(self.device)
        self.graphs = DecodeGraphPool(limits, self.model, self.attn, self.device)
        self.table = GreenListTable(limits.vocab_size, wm.gamma, wm.num_buckets, wm.hash_key, self.device)
        self.bias = GreenListBias(wm, self.table, self.device)
        self.detector = WatermarkDetector(self.table, self.bias)
        self.prev_tokens_np = np.zeros(limits.max_batch, dtype=np.int64)
        self.step_no = 0
        self.outputs: queue.Queue = queue.Queue()
        for bs in reversed(limits.graph_sizes):
            self.graphs.record(bs)

    def describe(self) -> Dict[str, float]:
        return {"gamma": self.wm.gamma, "delta": self.wm.delta, "sm_scale": self.attn._sm_scale}  # ok: FC103

    def prefill(self, pre: PrefillInputs, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        self.attn.plan_prefill(pre)
        return self.model(input_ids, positions, pre)

    def decode_step(self, reqs: List[Request]) -> None:
        self.step_no += 1
        step = StepInputs(reqs, self.limits.page_size, self.device)
        if self.graphs.fits(step.bs) and not self.attn.double_buffer_plans:
            logits = self.graphs.replay(step)
        else:
            self.attn.plan_pingpong(step)
            logits = self.model(step.prev_tokens, step.positions)
        logits = self.bias.apply(logits, step.prev_tokens, step.strength)
        next_tokens = torch.multinomial(torch.softmax(logits, dim=-1), 1).squeeze(-1)
        done_rows = torch.nonzero(next_tokens == self.limits.eos_token_id).flatten()  # expect: FC101
        # start the next step's page offsets on the device while the host detokenizes
        torch.cumsum(step.kv_lens_next, 0, out=self.attn.kv_indptr[1 : step.bs + 1])  # expect: FC104
        self.outputs.put((reqs, next_tokens, done_rows))
        if self.step_no % 512 == 0:
            logger.info("step %d, last tokens of the first rows %s", self.step_no, self.prev_tokens_np[:4].tolist())  # ok: FC101

    def drain_outputs(self) -> None:
        """Detokenizer thread: the only place that waits for sampled tokens."""
        while True:
            reqs, next_tokens, done_rows = self.outputs.get()
            tokens = next_tokens.tolist()
            self.prev_tokens_np[: len(tokens)] = tokens
            for r, tok in zip(reqs, tokens):
                r.output_ids.append(tok)
                r.kv_len += 1
            for i in done_rows.tolist():
                reqs[i].output_ids.append(-1)

    def detect(self, token_ids: List[int]) -> Dict[str, float]:
        z = self.detector.z_score(torch.tensor(token_ids, device=self.device))
        return {"z": z, "watermarked": float(z > 4.0)}
