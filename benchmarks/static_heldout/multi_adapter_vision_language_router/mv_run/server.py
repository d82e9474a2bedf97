"""The VLM server: routes, hot-loads adapters, encodes images, replays the shared graphs."""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import numpy as np
import torch

from mavl import AdapterBank, AdapterRouter, AdapterSpec, Request, RouterConfig
from mv_attn.backend import LMAttentionBackend
from mv_run.graph_pool import SharedDecodeGraphPool
from mv_run.lm import LoRALanguageModel
from mv_vision.encoders import ImageInput, VisionRouter


class VLMRouterServer:
    def __init__(self, cfg: RouterConfig, specs: List[AdapterSpec], device: torch.device):
        self.cfg = cfg
        self.device = device
        self.specs = {s.name: s for s in specs}
        self.bank = AdapterBank(cfg, specs, device)
        self.router = AdapterRouter(cfg, self.bank, device)
        self.vision = VisionRouter(cfg, specs, device)
        self.backend = LMAttentionBackend(cfg, self.vision.vision_workspace, device)
        self.model = LoRALanguageModel(cfg, self.bank, self.backend).to(device)
        self.kv_cache = torch.zeros(
            cfg.num_layers, cfg.max_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim,
            dtype=torch.bfloat16, device=device,
        )
        self.pool = SharedDecodeGraphPool(cfg, self.model, self.backend, self.kv_cache, device)
        self.usage_hist_cpu = torch.zeros(0, dtype=torch.int64)
        self.pending_weights: Dict[str, Tuple[torch.Tensor, torch.Tensor]] = {}
        self.stats: Dict[str, object] = {}

    def start(self) -> None:
        self.pool.record_all()

    def hot_load(self, name: str) -> None:
        spec = self.specs[name]
        a, b = self.pending_weights.pop(name)
        self.bank.load_adapter(name, spec.rank, a, b)
        self.router.known_adapters.add(name)
        new_scale = torch.full((1,), spec.alpha / spec.rank, dtype=torch.float32, device=self.device)
        self.bank.scaling = torch.cat([self.bank.scaling, new_scale])  # expect: FC107

    def prefill(self, reqs: List[Request], input_ids: torch.Tensor, image_pos: torch.Tensor) -> torch.Tensor:
        images: List[ImageInput] = [img for r in reqs for img in r.images]
        embeds, token_counts = self.vision.encode(images)
        self.stats["longest_image"] = max(token_counts)  # expect: FC101
        img_tokens_np = np.array(
            [sum(img.num_patches // self.specs[img.adapter].merge for img in r.images) for r in reqs],
            dtype=np.int32,
        )
        route = self.router.route_prompt(reqs, img_tokens_np)
        total_img = int(route.image_tokens_cpu.sum())  # ok: FC101
        if total_img > self.cfg.max_image_tokens:
            raise ValueError(f"{total_img} image tokens > {self.cfg.max_image_tokens}")
        self.model.set_image_kv(embeds)

        q_lens_np = np.array([r.prompt_len for r in reqs], dtype=np.int32) + img_tokens_np
        q_lens = torch.from_numpy(q_lens_np).to(self.device, non_blocking=True)
        tok_lora = torch.repeat_interleave(route.lora_ids, q_lens, output_size=int(q_lens_np.sum()))  # ok: FC101
        self.backend.plan_prompt(route)
        qo_indptr_cpu = torch.from_numpy(np.concatenate([[0], np.cumsum(q_lens_np)]).astype(np.int32))
        img_indptr_cpu = torch.from_numpy(np.concatenate([[0], np.cumsum(img_tokens_np)]).astype(np.int32))
        self.backend.plan_cross(qo_indptr_cpu, img_indptr_cpu)
        return self.model.forward_prompt(input_ids, embeds, image_pos, tok_lora, self.kv_cache)

    def step(
        self, reqs: List[Request], input_ids: torch.Tensor,
        new_reqs: Optional[List[Request]] = None, prompt_inputs: Optional[Tuple[torch.Tensor, torch.Tensor]] = None,
    ) -> torch.Tensor:
        route = self.router.route_decode(reqs)
        for name in route.new_adapters:
            self.hot_load(name)
        active = np.unique(route.lora_ids_np)  # ok: FC101
        if active.shape[0] > self.cfg.max_adapters:
            raise RuntimeError(f"{active.shape[0]} adapters in one batch")
        self.bank.gather_for_batch(route.lora_ids)
        counts_cpu = torch.from_numpy(np.bincount(route.lora_ids_np, minlength=self.cfg.max_adapters))
        self.usage_hist_cpu = torch.cat([self.usage_hist_cpu, counts_cpu])  # ok: FC107

        if new_reqs and prompt_inputs is not None:
            self.prefill(new_reqs, *prompt_inputs)
        if route.batch_size <= self.cfg.buckets[-1]:
            logits = self.pool.replay_bucket(route, input_ids)
        else:
            self.backend.plan_eager(route)
            logits = self.model.forward_decode(input_ids, route.lora_ids, self.kv_cache)

        # rows whose adapter switched were re-prefilled under the new adapter into fresh pages
        for row, pages in route.remapped.items():
            start = int(route.kv_indptr_cpu[row])
            fresh = torch.from_numpy(pages.astype(np.int32)).to(self.device, non_blocking=True)
            self.backend.kv_indices[start : start + len(pages)].copy_(fresh)  # expect: FC104
        return logits

    def adapter_usage_report(self) -> Dict[str, int]:
        usage = self.bank.usage.tolist()  # ok: FC101
        return {name: usage[slot] for name, slot in self.bank.slot_of.items()}
