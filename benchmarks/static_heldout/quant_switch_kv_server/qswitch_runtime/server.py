"""The serving loop: requests are classified into a KV dtype class on arrival and may be moved to the
other class when their context grows; each step decodes the BF16 class and the FP8 class separately."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterator, List, Optional, Tuple

import numpy as np
import torch

from qswitch.config import SwitchConfig
from qswitch.dtypes import KVClass, KVClassPolicy, default_policy
from qswitch.metadata import DecodeMetadataBuilder
from qswitch.pool import QuantKVPool
from qswitch.workspaces import WorkspacePool
from qswitch_backends.bf16 import Bf16Backend
from qswitch_backends.fp8 import Fp8Backend
from qswitch_backends.registry import QuantAttention, make_backend
from qswitch_runtime.graph_runner import QuantGraphRunner, StepInputs
from qswitch_runtime.model import QuantLM

logger = logging.getLogger(__name__)


@dataclass
class Request:
    rid: str
    prompt_len: int
    max_new_tokens: int
    priority: int = 0
    kv_class: KVClass = KVClass.BF16
    row: int = -1
    graph_span: Optional[Tuple[int, int]] = None
    last_token: int = 0
    output: List[int] = field(default_factory=list)


class QuantSwitchServer:
    def __init__(self, cfg: SwitchConfig, device: str = "cuda", policy: KVClassPolicy = default_policy):
        self.cfg = cfg
        self.device = torch.device(device)
        self.policy = policy
        self.pool = QuantKVPool(cfg, self.device)
        self.ws = WorkspacePool(cfg, self.device)
        self.fp8: Fp8Backend = make_backend("fp8", cfg, self.pool, self.ws, self.device)
        self.bf16: Bf16Backend = make_backend("bf16", cfg, self.pool, self.ws, self.device)
        self.attn = QuantAttention(self.fp8, self.bf16)
        self.model = QuantLM(cfg, self.pool, self.attn).to(self.device)
        self.builder = DecodeMetadataBuilder(cfg, self.pool, self.device)
        self.runner = QuantGraphRunner(self.model, self.attn, cfg, self.device)
        self.running: Dict[KVClass, List[Request]] = {k: [] for k in KVClass}
        self.on_switch: List[Callable[[Request, KVClass], None]] = [
            lambda req, new: logger.info("request %s moved to %s", req.rid, new.value)
        ]
        self.runner.capture_all()

    def classify(self, req: Request) -> KVClass:
        assert req.max_new_tokens > 0, "max_new_tokens must be positive"  # expect: FC109
        return self.policy(req.prompt_len, req.max_new_tokens, req.priority)

    def add_request(self, req: Request) -> None:
        req.kv_class = self.classify(req)
        admit = getattr(self, f"_admit_{req.kv_class.value}")
        admit(req)

    def _admit_bf16(self, req: Request) -> None:
        self.pool.alloc(req.rid, KVClass.BF16, req.prompt_len)
        self.running[KVClass.BF16].append(req)
        self._audit()

    def _admit_fp8(self, req: Request) -> None:
        self.pool.alloc(req.rid, KVClass.FP8, req.prompt_len)
        self.running[KVClass.FP8].append(req)
        self._audit()

    def _audit(self) -> None:
        assert sum(len(v) for v in self.running.values()) <= self.cfg.max_requests  # ok: FC109

    def switch_class(self, req: Request, new_class: KVClass) -> None:
        """Move a request to the other KV class (its pages are requantized by the copy kernel elsewhere)."""
        old = req.kv_class
        if old is KVClass.BF16 and req.graph_span is not None:
            lo, hi = req.graph_span
            # the freed BF16 pages may be reused at once; make sure the decode graph no longer reads them
            self.bf16.kv_indices[lo:hi].fill_(0)  # expect: FC104
        if old is KVClass.FP8 and req.row >= 0:
            self.fp8.block_tables[req.row].zero_()  # ok: FC104
        self.running[old].remove(req)
        self.pool.release(req.rid, old)
        self.pool.alloc(req.rid, new_class, self.pool.lens.get(req.rid, req.prompt_len))
        req.kv_class = new_class
        self.running[new_class].append(req)
        for cb in self.on_switch:
            cb(req, new_class)

    def upload_scales(self, k_amax: torch.Tensor, v_amax: torch.Tensor) -> None:
        with torch.cuda.stream(self.runner.copy_stream):
            self.fp8.update_scales(k_amax, v_amax)

    def _decode_class(self, kv_class: KVClass) -> None:
        reqs = self.running[kv_class]
        rids = [r.rid for r in reqs]
        for r in reqs:
            self.pool.grow(r.rid, kv_class)
        rows = np.arange(len(reqs), dtype=np.int64)
        meta = self.builder.build(kv_class, rids, rows)
        _, flat, _, lens = self.pool.tables(rids)
        indptr = meta.kv_indptr_cpu.numpy()
        for i, r in enumerate(reqs):
            r.row = i
            r.graph_span = (int(indptr[i]), int(indptr[i + 1]))
        out_loc_np = np.array(
            [self.pool.pages[r.rid][(n - 1) // self.cfg.page_size] * self.cfg.page_size + (n - 1) % self.cfg.page_size for r, n in zip(reqs, lens)],
            dtype=np.int64,
        )
        inputs = StepInputs(
            input_ids=torch.tensor([r.last_token for r in reqs], dtype=torch.int64).to(self.device, non_blocking=True),
            out_loc=torch.from_numpy(out_loc_np).to(self.device, non_blocking=True),
        )
        if self.runner.can_replay(kv_class, len(reqs)):
            logits = self.runner.replay(kv_class, meta, inputs)
        else:
            self.attn.select(kv_class)
            self.attn.init_forward_metadata(meta)
            logits = self.model.forward_decode(inputs.input_ids, inputs.out_loc, len(reqs))
        next_ids = torch.argmax(logits, dim=-1)
        for r, tok in zip(reqs, next_ids.tolist()):  # ok: FC101
            r.last_token = tok
            r.output.append(tok)

    @torch.inference_mode()
    def step(self) -> None:
        for kv_class in (KVClass.BF16, KVClass.FP8):
            if self.running[kv_class]:
                self._decode_class(kv_class)
        for req in list(self.running[KVClass.BF16]):
            if req.prompt_len + len(req.output) > 8192:
                self.switch_class(req, KVClass.FP8)

    def serve(self) -> Iterator[Dict[str, List[int]]]:
        while any(self.running.values()):
            self.step()
            yield {r.rid: r.output for reqs in self.running.values() for r in reqs}
