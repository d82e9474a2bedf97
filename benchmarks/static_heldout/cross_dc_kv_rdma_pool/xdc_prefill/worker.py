"""The prefill cluster's side: ragged FA2 prefill, then ship each request's latent pages and its manifest."""
from dataclasses import dataclass, field
from typing import List

import torch
from flashinfer import BatchPrefillWithRaggedKVCacheWrapper

from xdc.config import PrefillClusterConfig
from xdc.manifest import PageManifest, encode_manifest
from xdc.transport.rdma import RdmaEndpoint


@dataclass
class PrefillRequest:
    rid: int
    prompt_ids: List[int]
    pages: List[int] = field(default_factory=list)
    first_token: int = -1


class PrefillWorker:
    def __init__(self, cfg: PrefillClusterConfig, model: torch.nn.Module, latent_pool: torch.Tensor, endpoint: RdmaEndpoint, remote_addr: int, rkey: int, device: torch.device):
        self.cfg = cfg
        self.model = model
        self.latent_pool = latent_pool
        self.endpoint = endpoint
        self.remote_addr = remote_addr
        self.rkey = rkey
        self.device = device
        self.workspace = torch.zeros(cfg.workspace_bytes(), dtype=torch.uint8, device=device)
        self.ragged = BatchPrefillWithRaggedKVCacheWrapper(self.workspace, "NHD", backend="fa2")

    def run_batch(self, reqs: List[PrefillRequest]) -> None:
        c = self.cfg
        lens = [len(r.prompt_ids) for r in reqs]
        cu_host = torch.zeros(len(reqs) + 1, dtype=torch.int32)
        torch.cumsum(torch.tensor(lens, dtype=torch.int32), 0, out=cu_host[1:])
        self.ragged.plan(cu_host, cu_host, c.num_heads, c.num_heads, c.qk_head_dim, head_dim_vo=c.v_head_dim, causal=True, q_data_type=torch.bfloat16)
        ids = torch.tensor([t for r in reqs for t in r.prompt_ids], dtype=torch.int64).to(self.device, non_blocking=True)
        self.model(ids, self.ragged)
        for req in reqs:
            self._ship(req)

    def _ship(self, req: PrefillRequest) -> None:
        full, tail = divmod(len(req.prompt_ids), self.cfg.page_size)
        manifest = PageManifest(req.rid, full + (1 if tail else 0), len(req.prompt_ids), req.first_token, tail_tokens=tail, remote_pages=req.pages)
        for page in req.pages:
            self.endpoint.post_write(self.latent_pool[page], self.remote_addr, self.rkey, b"")
        self.endpoint.post_write(torch.tensor(req.pages, dtype=torch.int32), self.remote_addr, self.rkey, encode_manifest(manifest))
