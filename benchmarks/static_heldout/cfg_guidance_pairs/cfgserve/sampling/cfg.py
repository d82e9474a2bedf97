from __future__ import annotations

import numpy as np
import torch

from cfgserve.attention.backend import PairAttnBackend
from cfgserve.batch import DecodeBatch
from cfgserve.config import GenConfig
from cfgserve.sampling.schedule import guidance_schedule


class CFGSampler:
    """Mixes each pair's logits, guided = uncond + s * (cond - uncond), then samples
    top-k. `mix` is recorded into the decode graphs, so `scales` is a graph input."""

    def __init__(self, cfg: GenConfig, backend: PairAttnBackend):
        self.device = torch.device(cfg.device)
        self.backend = backend
        self.top_k = cfg.top_k
        self.kind = cfg.guidance_schedule
        self.total = cfg.image_tokens
        self.scales = torch.ones(cfg.max_pairs, dtype=torch.float32, device=self.device)
        self.scale_np = np.ones(cfg.max_pairs, dtype=np.float32)

    def set_scales(self, batch: DecodeBatch) -> None:
        n = batch.num_pairs
        for i in range(n):
            self.scale_np[i] = guidance_schedule(self.kind, int(batch.steps_np[i]), self.total,
                                                 float(batch.guidance_np[i]))
        self.scales = torch.empty(n, dtype=torch.float32, device=self.device)  # expect: FC107
        self.scales.copy_(torch.from_numpy(self.scale_np[:n]), non_blocking=True)

    def mix(self, logits: torch.Tensor, bs: int) -> torch.Tensor:
        cond, uncond = logits[:bs], logits[bs: 2 * bs]
        return torch.addcmul(uncond, self.scales[:bs, None], cond - uncond)

    def mix_eager(self, logits: torch.Tensor, batch: DecodeBatch) -> torch.Tensor:
        n = batch.num_pairs
        cond, uncond = logits[:n], logits[n: 2 * n]
        diff = self.backend.guidance_scratch(cond.numel()).view_as(cond)
        torch.sub(cond, uncond, out=diff)
        batch.guided = torch.empty_like(cond)  # ok: FC107
        torch.addcmul(uncond, self.scales[:n, None], diff, out=batch.guided)
        return batch.guided

    def sample(self, guided: torch.Tensor, cond_logits: torch.Tensor, batch: DecodeBatch) -> torch.Tensor:
        n = batch.num_pairs
        if (self.scales[:n] <= 1.0).all():  # expect: FC101
            # no pair is guided this step: skip the mixed logits
            logits = cond_logits[:n]
        else:
            logits = guided[:n]
        if np.all(batch.temperature_np[:n] == 0.0):  # ok: FC101
            return logits.argmax(dim=-1)
        temps = torch.from_numpy(np.maximum(batch.temperature_np[:n], 1e-5)).to(self.device, non_blocking=True)
        topv, topi = (logits / temps[:, None]).topk(self.top_k, dim=-1)
        choice = torch.multinomial(torch.softmax(topv, dim=-1), 1)
        ids = topi.gather(-1, choice).squeeze(-1)
        return torch.where(batch.greedy_mask_gpu[:n], logits.argmax(dim=-1), ids)  # ok: FC101
