"""The decode cluster's step: land arrivals, admit them, plan MLA, replay a bucket's graph or run eagerly."""
import logging
import queue
import threading
from dataclasses import dataclass, field
from typing import List, Tuple

import torch

from xdc.config import DecodeClusterConfig
from xdc.transport.rdma import RdmaEndpoint
from xdc_decode.arrivals import ArrivalHandler
from xdc_decode.attention import MlaDecodeAttention
from xdc_decode.graphs import DecodeGraphs
from xdc_decode.model import DeepseekDecoder
from xdc_decode.pool import DecodePagePool, PageRemapper

logger = logging.getLogger(__name__)


@dataclass
class DecodeRequest:
    rid: int
    pages: List[int]
    seq_len: int
    last_token: int
    output_ids: List[int] = field(default_factory=list)


class DecodeEngine:
    def __init__(self, cfg: DecodeClusterConfig, endpoint: RdmaEndpoint, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.endpoint = endpoint
        self.pool = DecodePagePool(cfg, device)
        self.remapper = PageRemapper(cfg, device)
        self.attn = MlaDecodeAttention(cfg, device)
        self.arrivals = ArrivalHandler(cfg, self.pool, self.remapper, self.attn, endpoint, device)
        self.model = DeepseekDecoder(cfg, self.attn, self.pool, device).to(device)
        self.graphs = DecodeGraphs(cfg, self.model, self.attn, device)
        self.rid_dev = torch.zeros(cfg.max_eager_bs, dtype=torch.int64, device=device)
        self.running: List[DecodeRequest] = []
        self.outputs: "queue.Queue[Tuple[torch.Tensor, torch.Tensor, List[int]]]" = queue.Queue()
        # oversized manifests land in the eager MLA wrapper's float workspace instead of a dedicated bounce region
        self.bounce = vars(self.attn.eager_mla)["_float_workspace_buffer"]  # expect: FC103
        self.endpoint.register(self.bounce)
        logger.info("decode engine on %s transport", self.endpoint._backend)  # ok: FC103
        self._drain = threading.Thread(target=self._drain_outputs, daemon=True)

    def start(self) -> None:
        self.graphs.capture_everything()
        self._drain.start()

    def _admit_ready(self) -> None:
        while self.arrivals.ready and len(self.running) < self.cfg.max_eager_bs:
            rid, pages, seq_len, first_token, tail_tokens = self.arrivals.ready.popleft()
            self.attn.set_tail(len(self.running), tail_tokens)
            self.running.append(DecodeRequest(rid, pages, seq_len, first_token))

    def _host_batch(self) -> Tuple[torch.Tensor, ...]:
        ps = self.cfg.page_size
        flat: List[int] = []
        width = max((len(r.pages) for r in self.running), default=1)
        table = torch.zeros(len(self.running), width, dtype=torch.int32)
        for row, req in enumerate(self.running):
            need = (req.seq_len + 1 + ps - 1) // ps
            if need > len(req.pages):
                req.pages.extend(self.pool.alloc(need - len(req.pages)))
            flat.extend(req.pages[:need])
            table[row, : len(req.pages)] = torch.tensor(req.pages, dtype=torch.int32)
        return (
            torch.tensor(flat, dtype=torch.int32).pin_memory(),
            torch.tensor([r.seq_len + 1 for r in self.running], dtype=torch.int32).pin_memory(),
            torch.tensor([r.rid for r in self.running], dtype=torch.int64).pin_memory(),
            torch.tensor([r.last_token for r in self.running], dtype=torch.int64).pin_memory(),
            torch.tensor([r.seq_len for r in self.running], dtype=torch.int64).pin_memory(),
            table,
        )

    def step(self) -> None:
        for completion in self.endpoint.poll(self.cfg.max_inflight_arrivals):
            self.arrivals.on_arrival(completion)
        self._admit_ready()
        if not self.running:
            return
        bs = len(self.running)
        page_ids_host, lens_host, rids_host, ids_host, pos_host, table_host = self._host_batch()
        self.rid_dev[:bs].copy_(rids_host, non_blocking=True)
        bucket = self.graphs.bucket_for(bs)
        if bucket is not None:
            self.attn.graph_bs = bucket
            self.attn.stage_batch(bucket, bs, page_ids_host, lens_host, table_host)
            logits = self.graphs.launch(bucket, bs, ids_host, pos_host)
        else:
            self.attn.graph_bs = None
            self.attn.stage_eager(bs, page_ids_host, lens_host)
            logits = self.model(ids_host.to(self.device, non_blocking=True), pos_host.to(self.device, non_blocking=True))
        next_ids = torch.argmax(logits, dim=-1)
        done = next_ids == self.cfg.eos_token_id
        finished_rids = self.rid_dev[:bs][done]  # expect: FC101
        self.outputs.put((next_ids, finished_rids, [r.rid for r in self.running]))
        for req in self.running:
            req.seq_len += 1

    def _drain_outputs(self) -> None:
        while True:
            next_ids, finished_rids, rids = self.outputs.get()
            tokens = next_ids.tolist()
            finished = set(finished_rids.tolist())
            for rid, tok in zip(rids, tokens):
                logger.debug("rid %d -> %d%s", rid, tok, " (eos)" if rid in finished else "")

    def replay_manifest_log(self, remote_ids: List[int]) -> List[int]:
        """Debug helper for the admin endpoint: where did these remote pages land?"""
        idx = torch.tensor(remote_ids, dtype=torch.int64).to(self.device)
        return self.remapper.table_gpu[idx].tolist()  # ok: FC101
