"""The VLM engine: image admissions through the vision graphs, decode through the LM graphs."""

from typing import List, Optional

import numpy as np
import torch

from lm_attn.backend import VLMAttentionBackend
from lm_attn.metadata import LMMetadataBuilder
from lm_run.decode_graphs import DecodeGraphRunner
from lm_run.model import VLMLanguageModel
from vlm import ImageInputs, ImageRequest, PromptBatchFactory, VLMConfig, scatter_image_embeds
from vt_graphs.vision_runner import VisionGraphRunner
from vt_graphs.vision_tower import VisionTower
from vt_graphs.workspace import vision_workspace


class VLMEngine:
    def __init__(self, cfg: VLMConfig):
        self.cfg = cfg
        self.device = cfg.device
        self.backend = VLMAttentionBackend(cfg)
        self.backend.init_graph_wrappers()
        self.model = VLMLanguageModel(cfg, self.backend).to(self.device)
        self.kv_cache = torch.zeros(
            cfg.num_layers, cfg.max_pages, 2, cfg.num_kv_heads, cfg.page_size, cfg.head_dim,
            dtype=torch.bfloat16, device=self.device,
        )
        self.tower = VisionTower(cfg, vision_workspace(self.device)).to(self.device)
        self.graph_pool = torch.cuda.graph_pool_handle()
        self.vision = VisionGraphRunner(self.tower, cfg, pool=self.graph_pool)
        self.decode = DecodeGraphRunner(self.model, self.backend, self.kv_cache, cfg, pool=self.graph_pool)
        self.builder = LMMetadataBuilder(cfg)
        self.factory = PromptBatchFactory(cfg)
        # page-table scratch of the prefill, sized for text prompts
        self.prefill_indices = torch.zeros(cfg.prefill_pages(), dtype=torch.int32, device=self.device)

    def start(self) -> None:
        self.vision.capture_vision_buckets()
        self.decode.capture_all()

    def admit(
        self,
        token_ids: List[np.ndarray],
        page_tables: List[np.ndarray],
        slot_mapping: np.ndarray,
        image_reqs: Optional[List[ImageRequest]] = None,
    ) -> torch.Tensor:
        flat = torch.from_numpy(np.concatenate(page_tables).astype(np.int32))
        n = int(flat.shape[0])
        images = None
        if image_reqs:
            images = self.factory.images(image_reqs)
            # image prompts overflow the prefill scratch: borrow the decode graphs' indices buffer
            self.backend.kv_indices_buf[:n].copy_(flat, non_blocking=True)  # expect: FC104
            kv_indices = self.backend.kv_indices_buf[:n]
        else:
            self.prefill_indices[:n].copy_(flat, non_blocking=True)  # ok: FC104
            kv_indices = self.prefill_indices[:n]
        batch = self.factory.prompt(token_ids, page_tables, kv_indices, images)
        meta = self.builder.build(batch)
        self.backend.init_forward_metadata(meta)
        embeds = self.model.embed(batch.input_ids)
        if images is not None and meta.image_positions is not None:
            embeds = scatter_image_embeds(embeds, self.vision.replay(images), meta.image_positions)
        slots = torch.from_numpy(slot_mapping).to(self.device, non_blocking=True)
        last_rows = (batch.qo_indptr_host[1:] - 1).to(torch.int64).to(self.device, non_blocking=True)
        return self.model.forward_prefill(embeds, batch.positions, self.kv_cache, slots, last_rows)

    def decode_step(
        self,
        seq_lens: np.ndarray,
        page_tables: List[np.ndarray],
        input_ids: np.ndarray,
        slot_mapping: np.ndarray,
    ) -> torch.Tensor:
        positions = torch.from_numpy(seq_lens.astype(np.int64) - 1).to(self.device, non_blocking=True)
        meta = self.builder.build_decode(seq_lens, page_tables, positions)
        ids = torch.from_numpy(input_ids).to(self.device, non_blocking=True)
        slots = torch.from_numpy(slot_mapping).to(self.device, non_blocking=True)
        if meta.padded_bs in self.decode.graphs:
            return self.decode.replay(meta, ids, slots)
        self.backend.init_forward_metadata(meta)
        return self.model.forward_decode(ids, positions, self.kv_cache, slots)

    def describe_images(self, images: ImageInputs) -> dict:
        return {"num_images": images.num_images, "grid_thw": images.grid_thw.tolist()}  # ok: FC101
