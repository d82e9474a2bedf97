import logging
from dataclasses import dataclass

import numpy as np
import torch
from flashinfer import BatchPrefillWithRaggedKVCacheWrapper

from vidserve.config import VISION_WORKSPACE_BYTES, VideoEngineConfig

logger = logging.getLogger(__name__)


@dataclass
class VideoChunk:
    index: int
    grid_thw_np: np.ndarray  # (t, h, w) patch grid of this chunk
    frame_valid: torch.Tensor  # device mask: False for the padding frames of the last chunk
    pixel_values: torch.Tensor


class VisionChunkPlanner:
    """Plans the ViT's FlashInfer prefill for one chunk of video frames: one sequence per temporal patch."""

    def __init__(self, cfg: VideoEngineConfig, device):
        self.cfg = cfg
        self.workspace = torch.zeros(VISION_WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.vit_wrapper = BatchPrefillWithRaggedKVCacheWrapper(self.workspace, "NHD")
        self._plan_info = None

    def prepare_chunk(self, chunk: VideoChunk):
        t, h, w = chunk.grid_thw_np.tolist()  # ok: FC101
        logger.debug("chunk %d frame mask %s", chunk.index, chunk.frame_valid)  # ok: FC101
        n_frames = int(chunk.frame_valid.sum())  # expect: FC101
        groups = min(t, n_frames // self.cfg.temporal_patch_size)
        cu = np.arange(0, (groups + 1) * h * w, h * w, dtype=np.int32)
        cu_host = torch.from_numpy(cu)
        self.vit_wrapper.plan(cu_host, cu_host, self.cfg.vit_heads, self.cfg.vit_heads, self.cfg.vit_head_dim, causal=False)  # ok: FC102
        layout = self.vit_wrapper._kv_layout  # expect: FC103
        self._plan_info = (chunk.index, groups, int(cu[-1]))  # ok: FC103
        return layout, groups
