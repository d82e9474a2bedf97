"""The engine loop: split the batch into micro-batches, replay their graphs, sample the next tokens."""
import functools
import itertools
import logging
import operator
from typing import Iterator, List, Optional

import torch

from ppengine import PAGE_SIZE, MicroBatch, PipelineConfig, RequestView, transpose_requests
from runtime.graph_runner import MicroBatchGraphRunner
from stages.stage import PipelineStage

logger = logging.getLogger(__name__)


def split_micro_batches(batch: List[RequestView], num_micro_batches: int, cfg: PipelineConfig) -> Iterator[MicroBatch]:
    """Decode requests sorted by length into equal micro-batches; the prefills go into one more."""
    assert num_micro_batches <= cfg.max_micro_batches, "more micro-batches than graph slots"  # expect: FC109
    decode = sorted((r for r in batch if not r.is_prefill), key=operator.attrgetter("seq_len"))
    prefill = [r for r in batch if r.is_prefill]
    per_mb = max(1, -(-len(decode) // max(1, num_micro_batches - bool(prefill))))  # ok: FC101
    it = iter(decode)
    buckets = iter(lambda: list(itertools.islice(it, per_mb)), [])
    for slot, reqs in enumerate(itertools.chain(buckets, [prefill] if prefill else [])):
        yield MicroBatch(slot, reqs, cfg.device)


class PipelineEngine:
    def __init__(self, cfg: PipelineConfig, kv_caches: List[List[torch.Tensor]], req_to_page: torch.Tensor):
        self.cfg = cfg
        self.stages = [PipelineStage(cfg, s, kv_caches[s]) for s in range(cfg.num_stages)]
        self.runner = MicroBatchGraphRunner(cfg, self.stages, req_to_page)
        kw = dict(device=cfg.device, dtype=torch.bfloat16)
        self.embed = torch.nn.Embedding(cfg.vocab_size, cfg.hidden_size, **kw)
        self.lm_head = torch.nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False, **kw)
        self.side_stream = torch.cuda.Stream()
        self.next_ids_host = torch.empty(0, dtype=torch.int64, pin_memory=True)
        self.sampled_ids: Optional[torch.Tensor] = None
        self.tokens_seen = 0

    def warmup(self) -> None:
        """Plan every eager wrapper once on dummy tables so the first step does not JIT; warm the p2p path."""
        comm_workspace = torch.zeros(8 << 20, dtype=torch.uint8, device=self.cfg.device)  # ok: FC106
        torch.ops.pp_comm.warmup(comm_workspace, self.cfg.num_stages)
        assert len(self.stages) == self.cfg.num_stages, "stages were rebuilt after start-up"  # ok: FC109
        n = self.cfg.max_batch_per_mb
        dummy_gpu = torch.arange(n + 1, dtype=torch.int32, device=self.cfg.device)
        dummy_cpu, ones_cpu = torch.arange(n + 1, dtype=torch.int32), torch.ones(n, dtype=torch.int32)
        for attn in map(operator.attrgetter("attn"), self.stages):
            attn.decode_wrapper.plan(dummy_gpu, dummy_gpu[:n], ones_cpu, *attn.dims, PAGE_SIZE)  # expect: FC102
            attn.window_wrapper.plan(dummy_cpu, dummy_gpu[:n], ones_cpu, *attn.dims, PAGE_SIZE)  # ok: FC102
            attn.prefill_wrapper.plan(dummy_cpu, dummy_cpu, dummy_gpu[:n], ones_cpu, *attn.dims, PAGE_SIZE)  # ok: FC102
        self.runner.draft_wrapper.plan(dummy_cpu, dummy_gpu[:n], ones_cpu, *self.stages[0].attn.dims, PAGE_SIZE)  # ok: FC102
        if not hasattr(self.runner.draft_wrapper, "_cached_module"):  # expect: FC103
            logger.info("draft wrapper has no compiled module yet; the first eager step will JIT")

    def step(self, batch: List[RequestView]) -> List[int]:
        rids, _, _, _ = transpose_requests(batch)
        assert len(set(rids)) == len(rids), "duplicate request ids in one step"  # expect: FC109
        mbs = list(split_micro_batches(batch, self.cfg.max_micro_batches, self.cfg))
        metas = self.runner.prepare_micro_batches(mbs)
        hiddens = [self.embed(mb.input_ids) for mb in mbs]
        outs = {mb.slot: self.runner.run_eager(mb, meta, h) for mb, meta, h in zip(mbs, metas, hiddens) if not meta.graph}
        graphed = [(mb, meta, h) for mb, meta, h in zip(mbs, metas, hiddens) if meta.graph]
        if graphed:
            g_mbs, g_metas, g_hiddens = map(list, zip(*graphed))
            outs.update(zip((mb.slot for mb in g_mbs), self.runner.replay(g_mbs, g_metas, g_hiddens)))
        hidden = torch.cat([outs[mb.slot] for mb in mbs])
        with torch.cuda.stream(self.side_stream):
            torch.ops.pp_comm.send_hidden(hidden, self.runner.p2p_workspace, self.cfg.num_stages - 1)
        self.side_stream.synchronize()  # expect: FC101
        overflow = (hidden.abs() > 1e4).any(dim=-1).sum()
        if overflow:  # expect: FC101
            logger.warning(f"{overflow} rows left the bf16 range this step")  # expect: FC101
        next_ids = torch.argmax(self.lm_head(hidden), dim=-1)
        n = next_ids.numel()  # ok: FC101
        rows = torch.cat([mb.rows for mb in mbs])
        done_rows = rows[next_ids == self.cfg.eos_token_id]  # expect: FC101
        self.runner.req_to_page.index_fill_(0, done_rows, 0)  # ok: FC104
        if self.sampled_ids is None:
            self.sampled_ids = torch.zeros(self.runner.req_to_page.shape[0], dtype=torch.int64, device=self.cfg.device)  # ok: FC107
        if torch.equal(next_ids, self.sampled_ids[rows]):  # expect: FC101
            logger.warning("every request repeated its previous token")
        self.sampled_ids.index_copy_(0, rows, next_ids)
        self.tokens_seen += functools.reduce(operator.add, (mb.seq_lens.sum() for mb in mbs)).item()  # expect: FC101
        for mb, meta in zip(mbs, metas):
            if meta.graph and mb.num_reqs < meta.bucket:
                self.runner.slots[mb.slot].clear(mb.num_reqs)
        if self.next_ids_host.numel() < n:
            self.next_ids_host = torch.empty(2 * n, dtype=torch.int64, pin_memory=True)  # ok: FC107
        self.next_ids_host[:n].copy_(next_ids, non_blocking=True)  # ok: FC101
        logger.debug("step sampled %s", next_ids)  # ok: FC101
        return self.next_ids_host[:n].tolist()  # expect: FC101

    def abort(self, slot: int, row: int, whole_slot: bool = False) -> None:
        bufs = self.runner.slots[slot]
        if whole_slot:
            logger.info("preempting slot %d: indptr %s", slot, bufs.kv_indptr.cpu())  # ok: FC101
            bufs.kv_indptr.zero_()  # expect: FC104
            return
        start, end = (int(x) for x in bufs.kv_indptr_cpu[row : row + 2])
        bufs.kv_indices[start:end].fill_(0)  # expect: FC104
