"""The step loop: a decode-only step replays a graph, a mixed step runs eagerly."""

from typing import List, Optional, Tuple

import torch

from chunkserve.config import ChunkConfig
from chunkserve.request import Request, StepPlan
from chunkserve.scheduler import ChunkedScheduler, PagePool
from chunk_attn.backend import InterleavedAttnBackend
from chunk_attn.graphs import DecodeOnlyGraphs
from chunk_attn.metadata import DevicePageTable, HostStaging, build_chunk_metadata, build_decode_only_metadata
from chunk_attn.model import ChunkLM


class InterleaveEngine:
    def __init__(self, cfg: ChunkConfig, device: str = "cuda"):
        self.cfg = cfg
        self.device = device
        self._backend = "flashinfer"
        self.pages = PagePool(cfg.num_pages)
        self.scheduler = ChunkedScheduler(cfg, self.pages)
        self.page_table = DevicePageTable(cfg, device)
        self.backend = InterleavedAttnBackend(cfg, self.page_table, device)
        self.model = ChunkLM(cfg, self.backend).to(device=device, dtype=torch.bfloat16)
        self.graphs = DecodeOnlyGraphs(self.model, self.backend, cfg, device)
        self.staging = HostStaging(cfg)
        self.ids_cpu = torch.zeros(cfg.max_running + cfg.token_budget, dtype=torch.int64, pin_memory=True)
        self.out_cpu = torch.zeros(cfg.max_running + cfg.max_running, dtype=torch.int64, pin_memory=True)
        self.out_event = torch.cuda.Event()
        self._pending: Optional[Tuple[StepPlan, int]] = None

    def start(self) -> None:
        if self._backend != "flashinfer":  # ok: FC103
            raise RuntimeError(f"unsupported attention backend {self._backend}")
        self.graphs.record_all()

    def add_request(self, req: Request) -> None:
        self.scheduler.add_request(req)

    def _upload_ids(self, ids: List[int]) -> torch.Tensor:
        n = len(ids)
        self.ids_cpu[:n] = torch.tensor(ids, dtype=torch.int64)
        return self.ids_cpu[:n].to(self.device, non_blocking=True)

    def step(self) -> Optional[StepPlan]:
        plan = self.scheduler.schedule()
        if not plan.decodes and not plan.chunks:
            return None
        if plan.decode_only:
            md = build_decode_only_metadata(plan, self.page_table, self.staging, self.cfg, self.device)
            ids = self._upload_ids([r.output_ids[-1] for r in plan.decodes])
            if md.num_decode <= self.graphs.max_bs:
                logits = self.graphs.run(md, ids)
            else:
                self.backend.prepare_decode_eager(md)
                logits = self.model.forward_decode(ids, md.positions)
            sampled = torch.argmax(logits, dim=-1)
        else:
            md = build_chunk_metadata(plan, self.page_table, self.staging, self.cfg, self.device)
            self.backend.prepare_mixed(md)
            ids = self._upload_ids(
                [r.output_ids[-1] for r in plan.decodes] + [t for c in plan.chunks for t in c.req.prompt_ids[c.start : c.end]]
            )
            logits = self.model.forward_mixed(ids, md.positions, md.logit_rows)
            keep = md.chunk_end_dev == md.prompt_len_dev
            prefill_logits = logits[md.num_decode :][keep]  # expect: FC101
            sampled = torch.cat([logits[: md.num_decode].argmax(dim=-1), prefill_logits.argmax(dim=-1)])
            if md.num_patch:
                # decode rows that opened a page: patch the decode graphs' page list in place
                self.backend.graph_bufs["kv_indices"].index_copy_(0, md.patch_pos, md.patch_pages)  # expect: FC104
        n = sampled.shape[0]
        self.out_cpu[:n].copy_(sampled, non_blocking=True)
        self.out_event.record()
        self._pending = (plan, n)
        return plan

    def finish_step(self) -> List[Request]:
        """Runs on the driver loop after `step`: read the sampled tokens and commit them."""
        if self._pending is None:
            return []
        plan, n = self._pending
        self._pending = None
        self.out_event.synchronize()
        finished = self.scheduler.commit(plan, self.out_cpu[:n].tolist())
        for req in finished:
            self.page_table.release(req)
        return finished
