"""The encoder stage: batches images, runs the ViT, caches and ships the embeddings."""

import logging
import math
from dataclasses import dataclass
from typing import Dict, List, Tuple

import torch

from epd.config import EPDConfig
from epd.protocol import EmbeddingHandle
from epd.transfer import TransferEngine
from epd_encoder.embed_cache import EmbeddingCache
from epd_encoder.vision import VisionEncoder

logger = logging.getLogger(__name__)


@dataclass
class EncoderBatch:
    cu_patches: torch.Tensor
    seq_sizes: List[int]
    n_chunks: int
    out: torch.Tensor


class EncoderBatchMetadataBuilder:
    def __init__(self, cfg: EPDConfig) -> None:
        self.cfg = cfg
        self.device = cfg.device
        self.chunk_patches = cfg.encoder_chunk_patches
        self.dtype = torch.bfloat16
        self.out_embeds = torch.empty(
            cfg.merged_rows(cfg.max_patches_per_batch), cfg.hidden_size, dtype=self.dtype, device=cfg.device
        )

    def build(self, grid_thw_list: List[Tuple[int, int, int]]) -> EncoderBatch:
        grid_thw = torch.tensor(grid_thw_list, dtype=torch.int32, device=self.device)
        patches_per_image = grid_thw.prod(-1)
        cu_patches = torch.zeros(len(grid_thw_list) + 1, dtype=torch.int32, device=self.device)
        torch.cumsum(patches_per_image, 0, out=cu_patches[1:])
        logger.debug("encoder batch grid=%s", grid_thw)  # ok: FC101
        total_patches = patches_per_image.sum()
        n_chunks = math.ceil(total_patches / self.chunk_patches)  # expect: FC101
        seq_sizes = [t * h * w for t, h, w in grid_thw_list]
        n_out = self.cfg.merged_rows(sum(seq_sizes))
        if n_out > self.out_embeds.shape[0]:
            self.out_embeds = torch.empty(n_out, self.cfg.hidden_size, dtype=self.dtype, device=self.device)  # expect: FC107
        return EncoderBatch(cu_patches=cu_patches, seq_sizes=seq_sizes, n_chunks=n_chunks, out=self.out_embeds[:n_out])


class EncoderStage:
    def __init__(self, cfg: EPDConfig, transfer: TransferEngine) -> None:
        self.cfg = cfg
        self.transfer = transfer
        patch_dim = 3 * 2 * cfg.patch_size * cfg.patch_size
        self.encoder = VisionEncoder(
            patch_dim, cfg.vision_hidden, cfg.vision_heads, cfg.vision_layers, cfg.hidden_size, cfg.spatial_merge
        ).to(cfg.device, torch.bfloat16)
        self.builder = EncoderBatchMetadataBuilder(cfg)
        self.cache = EmbeddingCache(cfg.embed_cache_rows, cfg.hidden_size, torch.bfloat16, cfg.device)

    @torch.inference_mode()
    def encode(self, items: List[Tuple[str, str, Tuple[int, int, int], torch.Tensor]]) -> Dict[str, EmbeddingHandle]:
        handles: Dict[str, EmbeddingHandle] = {}
        todo = []
        for req_id, mm_hash, grid, pixels in items:
            hit = self.cache.lookup(mm_hash)
            if hit is not None:
                handles[mm_hash] = EmbeddingHandle(req_id, mm_hash, hit[0], hit[1])
            else:
                todo.append((req_id, mm_hash, grid, pixels))
        if not todo:
            return handles
        batch = self.builder.build([grid for _, _, grid, _ in todo])
        patches = torch.cat([p.to(self.cfg.device, torch.bfloat16, non_blocking=True) for *_, p in todo])
        batch.out.copy_(self.encoder(patches, batch.seq_sizes))
        offset = 0
        for (req_id, mm_hash, _, _), size in zip(todo, batch.seq_sizes):
            rows = self.cfg.merged_rows(size)
            start, n = self.cache.put(mm_hash, batch.out[offset : offset + rows])
            handles[mm_hash] = EmbeddingHandle(req_id, mm_hash, start, n)
            offset += rows
        return handles
