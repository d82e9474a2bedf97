from typing import Dict, List

import flashcheck
import numpy as np
import torch

from bieval import EvalRequest, EvalScheduler, InvariantConfig, ReplayChecker, SeedBank
from bi_attn.backend import InvariantBackend
from bi_attn.metadata import InvariantMetadataBuilder, StepMeta
from bi_attn.plans import kernel_fingerprint, schedule_signature
from bi_run.graphs import InvariantGraphRunner
from bi_run.model import InvariantModel, sample_rows


class Outbox:
    """Sampled tokens leave the device through a pinned buffer; the output
    loop drains it after the step's event."""

    def __init__(self, max_bs: int):
        self.pinned = torch.zeros(max_bs, dtype=torch.long, pin_memory=True)
        self.ready = torch.cuda.Event()
        self.n = 0

    def push(self, tokens: torch.Tensor) -> None:
        self.n = tokens.numel()
        self.pinned[: self.n].copy_(tokens, non_blocking=True)
        self.ready.record()

    def drain(self) -> List[int]:
        self.ready.synchronize()
        return self.pinned[: self.n].tolist()


class EvalServer:
    def __init__(self, cfg: InvariantConfig):
        self.cfg = cfg
        self.device = torch.device(cfg.device)
        self.backend = InvariantBackend(cfg)
        self.model = InvariantModel(cfg, self.backend).to(self.device)
        self.builder = InvariantMetadataBuilder(cfg)
        self.bank = SeedBank(cfg.max_batch, self.device)
        self.graphs = InvariantGraphRunner(self.model, self.backend, self.builder, self.bank, cfg)
        self.scheduler = EvalScheduler(cfg.max_batch, cfg.page_size, cfg.max_pages)
        self.checker = ReplayChecker(cfg)
        self.outbox = Outbox(cfg.max_batch)
        self.free_slots = list(range(cfg.max_batch - 1, -1, -1))
        self.temperature_np = np.zeros(cfg.max_batch, dtype=np.float32)

    def submit(self, req: EvalRequest, temperature: float = 0.0) -> None:
        req.slot = self.free_slots.pop()
        self.bank.register(req.slot, req.seed)
        self.temperature_np[req.slot] = temperature
        self.scheduler.add(req)

    def _slots(self, batch) -> torch.Tensor:
        page = self.cfg.page_size
        slots = [r.pages[p // page] * page + p % page for r, n in zip(batch.reqs, batch.qo_lens)
                 for p in range(r.seq_len - n, r.seq_len)]
        return torch.tensor(slots, dtype=torch.long).to(self.device, non_blocking=True)

    def _eager(self, meta: StepMeta, ids: torch.Tensor, slots: torch.Tensor, temp: torch.Tensor):
        self.backend.init_forward_metadata(meta)
        logits = self.model(ids, slots)
        token_lp = logits[:-1].log_softmax(-1).gather(-1, ids[1:, None]).squeeze(-1)
        if getattr(self, "_score_buf", None) is None:
            self._score_buf = torch.zeros(self.cfg.max_batch, device=self.device)  # ok: FC107
        self._score_buf[: meta.num_reqs].zero_().index_add_(0, meta.token_to_req[1:], token_lp)
        last = logits.index_select(0, (meta.qo_indptr_cpu[1:] - 1).to(self.device, non_blocking=True))
        seeds, offsets = self.bank.draw(meta.rows, meta.rows_cpu)
        return last, sample_rows(last, seeds, offsets, temp)

    @flashcheck.hot_path
    def step(self) -> int:
        batch = self.scheduler.next_batch()
        if batch is None:
            return 0
        meta = self.builder.build(batch)
        ids = torch.from_numpy(batch.input_ids_np).to(self.device, non_blocking=True)
        slots = self._slots(batch)
        temp = torch.from_numpy(self.temperature_np[meta.rows_cpu.numpy()]).to(self.device, non_blocking=True)
        if meta.bucket is None:
            logits, tokens = self._eager(meta, ids, slots, temp)
        else:
            self.backend.init_forward_metadata_replay_cuda_graph(meta.bucket, meta)
            tokens = self.graphs.replay(meta.bucket, meta, ids, slots, temp)
            logits = self.graphs.static_logits[meta.bucket][: meta.num_reqs]
        if torch.isnan(logits).any():  # expect: FC101
            raise FloatingPointError(f"non-finite logits in a batch of {meta.num_reqs}")
        self.outbox.push(tokens)
        return meta.num_reqs

    def collect(self, batch_reqs: List[EvalRequest]) -> None:
        for r, tok in zip(batch_reqs, self.outbox.drain()):
            r.output.append(tok)

    def reset_between_runs(self) -> None:
        # nothing from the batched run may leak into the single-request replays
        self.backend.kv_indices_buf.zero_()  # expect: FC104
        self.bank.offsets.zero_()

    def verify_sample(self, batched: Dict[int, torch.Tensor], singles: Dict[int, torch.Tensor]) -> bool:
        self.reset_between_runs()
        sig = schedule_signature(self.backend.decode_wrappers[1])
        ok = kernel_fingerprint(self.backend.eager["full"]) != "unknown"
        for req_id, out in batched.items():
            self.checker.remember_plan(req_id, sig)
            ok &= self.checker.compare(req_id, out, singles[req_id])
        return ok
