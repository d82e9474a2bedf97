"""Landing shipped requests: remap the prefill node's page ids onto local pages and scatter the landed latent KV."""
import logging
from collections import deque
from typing import Deque, List, Optional, Tuple

import torch

from xdc.config import DecodeClusterConfig
from xdc.manifest import decode_manifest
from xdc.transport.rdma import Completion, RdmaEndpoint
from xdc_decode.attention import MlaDecodeAttention
from xdc_decode.pool import DecodePagePool, PageRemapper

logger = logging.getLogger(__name__)


class ArrivalHandler:
    def __init__(self, cfg: DecodeClusterConfig, pool: DecodePagePool, remapper: PageRemapper, attn: MlaDecodeAttention, endpoint: RdmaEndpoint, device: torch.device):
        self.cfg = cfg
        self.pool = pool
        self.remapper = remapper
        self.attn = attn
        self.endpoint = endpoint
        self.device = device
        width = cfg.kv_lora_rank + cfg.qk_rope_head_dim
        # the prefill node RDMA-writes remote page ids here (pinned) and the latent pages into the landing zone
        self.staging_pinned = torch.zeros(cfg.max_pages_per_req, dtype=torch.int32, pin_memory=True)
        self.landing = [torch.zeros(cfg.max_pages_per_req, cfg.page_size, width, dtype=torch.bfloat16, device=device) for _ in range(cfg.num_layers)]
        self.endpoint.register(self.staging_pinned)
        for zone in self.landing:
            self.endpoint.register(zone)
        self.ready: Deque[Tuple[int, List[int], int, int, int]] = deque()

    def on_arrival(self, completion: Completion) -> Optional[int]:
        manifest = decode_manifest(completion.header)
        n = manifest.num_pages
        if n > self.staging_pinned.numel():
            self.staging_pinned = torch.zeros(n, dtype=torch.int32, pin_memory=True)  # ok: FC107
            self.endpoint.register(self.staging_pinned)
            return None
        remote_ids = self.staging_pinned[:n].tolist()  # ok: FC101
        local_pages = self.pool.alloc(n)
        self.remapper.install(manifest, remote_ids, local_pages)
        remote_dev = self.staging_pinned[:n].to(self.device, non_blocking=True).long()
        local_ids = self.remapper.table_gpu[remote_dev].long()
        if (local_ids < 0).any():  # expect: FC101
            raise RuntimeError(f"request {manifest.rid}: arrival names pages that were never registered")
        for layer, zone in enumerate(self.landing):
            self.pool.kv_cache[layer][local_ids] = zone[:n]  # ok: FC104
        logger.debug("request %d landed in local pages %s", manifest.rid, local_ids)  # ok: FC101
        offset = self.attn.reserve_rows(manifest.rid, n)
        # pre-stage the request's page ids in the decode graph's indices so its first step can skip the copy
        self.attn.kv_indices[offset : offset + n].copy_(local_ids.int(), non_blocking=True)  # expect: FC104
        self.ready.append((manifest.rid, local_pages, manifest.seq_len, manifest.first_token, manifest.tail_tokens))
        return manifest.rid
