"""Engine: per-bucket decode graphs and the decode/extend steps under the project decorators."""
import logging
from typing import Dict, List, Optional

import torch

from attn.backend import FlashInferBackend
from attn.trtllm_gen import TrtllmGenDecode
from dwserve.batch import ForwardBatch, ForwardMode
from dwserve.config import ServeConfig
from dwserve.decorators import capture_synced, retry_on_oom, step_timer, traced
from runner.model import DecoderModel

logger = logging.getLogger(__name__)


class DecodeGraphRunner:
    def __init__(self, cfg: ServeConfig, model: DecoderModel, backend: FlashInferBackend, trtllm: TrtllmGenDecode, device):
        self.cfg, self.model, self.backend, self.trtllm, self.device = cfg, model, backend, trtllm, device
        self.max_bucket = max_bs = cfg.buckets[-1]
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.pool = torch.cuda.graph_pool_handle()
        self.kv_caches: List[torch.Tensor] = []
        self.static_input_ids = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.static_positions = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.static_seq_lens = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.graph_next_ids: Dict[int, torch.Tensor] = {}
        self.draft_logits: Dict[int, torch.Tensor] = {}
        self.next_ids_cpu = torch.zeros(max_bs, dtype=torch.int64, pin_memory=True)
        self._use_cuda_graph = True  # ok: FC103
    def bucket_for(self, raw_bs: int) -> int:
        return min(b for b in self.cfg.buckets if b >= raw_bs)  # ok: FC101
    @capture_synced
    def capture_all(self, kv_caches: List[torch.Tensor]):
        self.kv_caches = kv_caches
        self.backend.init_graph_wrappers(self.cfg.buckets)
        for bs in sorted(self.cfg.buckets, reverse=True):
            self.capture_bucket(bs)
        torch.cuda.synchronize()  # ok: FC101
        assert len(self.graphs) == len(self.cfg.buckets), "a bucket failed to capture"  # ok: FC109
    def init_capture_inputs(self, bs: int):
        self.static_input_ids[:bs].zero_()
        self.backend.kv_indptr[: bs + 1].copy_(torch.arange(bs + 1, dtype=torch.int32, device=self.device))  # ok: FC104
        self.backend.kv_last_page_len[:bs].fill_(1)  # ok: FC104
        self.backend.kv_indptr_cpu[: bs + 1] = self.trtllm.kv_indptr_cpu[: bs + 1] = torch.arange(bs + 1, dtype=torch.int32)
    def _dummy_batch(self, bs: int) -> ForwardBatch:
        b = self.backend
        return ForwardBatch(ForwardMode.DECODE, bs, self.static_input_ids[:bs], self.static_positions[:bs],
                            self.static_seq_lens[:bs], torch.ones(bs, dtype=torch.int32), torch.arange(bs, device=self.device),
                            b.kv_indptr[: bs + 1], b.kv_indptr_cpu[: bs + 1], b.kv_indices, b.kv_last_page_len[:bs],
                            b.kv_last_page_len_cpu[:bs])
    @capture_synced
    def capture_bucket(self, bs: int):
        assert bs <= self.cfg.max_batch_size, f"bucket {bs} above max_batch_size"  # expect: FC109
        c = self.cfg
        w = self.backend.graph_wrappers[bs]
        self.init_capture_inputs(bs)
        w.plan(  # expect: FC102
            self.backend.kv_indptr[: bs + 1], self.backend.kv_indices[:bs], self.backend.kv_last_page_len_cpu[:bs],
            **self.backend.heads())
        logger.debug("bucket %d: wrapper fixed to %d rows", bs, w._fixed_batch_size)  # expect: FC103
        self.trtllm.wrappers[bs].plan(  # ok: FC102
            self.trtllm.kv_indptr_cpu[: bs + 1], self.trtllm.kv_indices[:bs], self.trtllm.kv_last_page_len_cpu[:bs],
            c.num_qo_heads, c.num_kv_heads, c.head_dim, c.page_size)
        # the MTP draft wrapper was built eagerly; flip it so its run() skips the per-call checks
        self.trtllm.draft_wrapper._use_cuda_graph = True  # expect: FC103
        batch = self._dummy_batch(bs)
        logger.info(f"capturing bucket {bs}: seq_lens={batch.seq_lens}")  # expect: FC101
        self.graph_next_ids[bs] = torch.zeros(bs, dtype=torch.int64, device=self.device)  # ok: FC107
        self.graphs[bs] = g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool):
            hidden = self.model.forward_decode(batch.input_ids, batch.positions, self.kv_caches, batch)
            torch.argmax(self.model.compute_logits(hidden), dim=-1, out=self.graph_next_ids[bs])
            draft = self.model.forward_mtp(hidden, batch.positions, self.kv_caches[-1], batch)
            self.draft_logits[bs] = self.model.compute_logits(draft)
    @step_timer("replay")
    def replay(self, batch: ForwardBatch) -> torch.Tensor:
        assert self.graphs, "capture_all() must run before replay()"  # ok: FC109
        raw_bs, bs = batch.batch_size, self.bucket_for(batch.batch_size)
        self.static_input_ids[:raw_bs].copy_(batch.input_ids)  # ok: FC104
        self.static_positions = torch.cat([batch.positions, self.static_positions[raw_bs:bs]])  # expect: FC107
        self.static_seq_lens[:raw_bs].copy_(batch.seq_lens)
        self.backend.plan_bucket(bs, batch)
        self.trtllm.plan_bucket(batch, bs)
        self.trtllm.plan_draft(batch)
        self.backend.kv_indptr[raw_bs + 1 : bs + 1] = self.backend.kv_indptr_cpu[raw_bs]  # expect: FC104
        self.graphs[bs].replay()
        self.next_ids_cpu[:raw_bs].copy_(self.graph_next_ids[bs][:raw_bs])  # expect: FC101
        return self.next_ids_cpu[:raw_bs]


class Engine:
    def __init__(self, cfg: ServeConfig, device: torch.device):
        self.cfg, self.device, max_bs = cfg, device, cfg.max_batch_size
        self.backend = FlashInferBackend(cfg, device)
        self.trtllm = TrtllmGenDecode(cfg, device)
        self.model = DecoderModel(cfg, self.backend, self.trtllm).to(device)
        self.graph_runner = DecodeGraphRunner(cfg, self.model, self.backend, self.trtllm, device)
        shape = (cfg.max_total_pages // cfg.num_layers, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim)
        self.kv_caches = [torch.zeros(shape, dtype=torch.bfloat16, device=device) for _ in range(cfg.num_layers)]
        self.copy_stream = torch.cuda.Stream()
        self.next_ids = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.logprobs = torch.zeros(max_bs, dtype=torch.float32, device=device)
        self.free_slots = torch.arange(max_bs, dtype=torch.int64, device=device)
        self.token_slots = torch.zeros(cfg.max_num_tokens, dtype=torch.int64, device=device)
        self.last_token_idx = torch.zeros(max_bs, dtype=torch.int32, device=device)
        self.done_cpu = torch.zeros(max_bs, dtype=torch.bool, pin_memory=True)
        self.done_event = torch.cuda.Event()
        self.eos_table: Optional[torch.Tensor] = None
        self._plan_info = {"decode": 0, "extend": 0}  # ok: FC103
    def warmup(self):
        """One eager plan per wrapper so FlashInfer's JIT modules are loaded, then capture."""
        assert not self.graph_runner.graphs, "warmup() runs once, before capture"  # ok: FC109
        c = self.cfg
        qo = torch.arange(0, 2, dtype=torch.int32, device=self.device)
        self.backend.plan_ragged(qo, qo, c.num_qo_heads, c.num_kv_heads, c.head_dim)  # expect: FC102
        self.backend.decode_wrapper.plan(torch.tensor([0, 1], dtype=torch.int32), qo[:1], torch.ones(1, dtype=torch.int32),  # ok: FC102
                                         c.num_qo_heads, c.num_kv_heads, c.head_dim, c.page_size)
        for w in (self.backend.decode_wrapper, self.backend.ragged_wrapper):
            if getattr(w, "_cached_module", None) is None:  # expect: FC103
                logger.warning("%s has no cached module after warmup", type(w).__name__)
        self.graph_runner.capture_all(self.kv_caches)
    @step_timer("decode")
    @retry_on_oom(retries=1)
    @torch.inference_mode()
    def decode_step(self, batch: ForwardBatch, page_remap: Optional[torch.Tensor] = None) -> List[int]:
        assert batch.batch_size <= self.cfg.max_batch_size, "scheduler overfilled the batch"  # expect: FC109
        if page_remap is not None:
            self.compact_pages(page_remap)
        if batch.batch_size <= self.graph_runner.max_bucket:
            tokens = self.graph_runner.replay(batch).tolist()  # ok: FC101
        else:
            tokens = self._decode_eager(batch)
        self.last_tokens_host = torch.tensor(tokens, dtype=torch.int64)  # ok: FC107
        self._plan_info["decode"] += 1  # ok: FC103
        self.backend.kv_last_page_len[: batch.batch_size] += 1  # expect: FC104
        self.backend.kv_last_page_len_cpu[: batch.batch_size] += 1  # ok: FC104
        return tokens
    def _decode_eager(self, batch: ForwardBatch) -> List[int]:
        self.backend.init_forward_metadata(batch)
        if self.cfg.use_trtllm_gen:
            self.trtllm.prepare_direct(batch)
        hidden = self.model.forward_decode(batch.input_ids, batch.positions, self.kv_caches, batch)
        logits = self.model.compute_logits(hidden)
        next_ids = torch.argmax(logits, dim=-1)
        out = {"next_ids": next_ids, "logprobs": torch.log_softmax(logits, -1).gather(1, next_ids[:, None])[:, 0]}
        for name in ("next_ids", "logprobs"):
            setattr(self, name, out[name].clone())  # expect: FC107
        self.release_rows(batch.req_pool_indices[next_ids == self.cfg.eos_token_id])  # expect: FC101
        return next_ids.tolist()  # expect: FC101
    def release_rows(self, done_rows: torch.Tensor):
        with torch.cuda.stream(self.copy_stream):
            self.free_slots = torch.cat([self.free_slots, done_rows])  # expect: FC107
        self.copy_stream.synchronize()  # expect: FC101
    def compact_pages(self, remap: torch.Tensor):
        """Page defragmentation: rewrite the page ids after the allocator moved pages."""
        idx = self.backend.kv_indices
        idx.copy_(remap[idx])  # expect: FC104
        self.trtllm.kv_indices.copy_(remap[self.trtllm.kv_indices])  # expect: FC104
    @traced("extend")
    @retry_on_oom(retries=2)
    @torch.no_grad()
    def extend_step(self, batch: ForwardBatch) -> torch.Tensor:
        bs, c = batch.batch_size, self.cfg
        self.backend.init_forward_metadata(batch)
        if c.use_trtllm_gen:
            self.trtllm.prepare_direct(batch)
        n_tokens = int(batch.qo_indptr[-1])  # expect: FC101
        token_slots = torch.repeat_interleave(batch.req_pool_indices, batch.extend_lens)  # expect: FC101
        self.token_slots[:n_tokens].copy_(token_slots)
        batch.extend_start_loc = torch.zeros(bs, dtype=torch.int32, device=self.device)  # ok: FC107
        torch.cumsum(batch.extend_lens[:-1], 0, out=batch.extend_start_loc[1:])
        self.last_token_idx = batch.qo_indptr.new_empty(bs)  # expect: FC107
        torch.sub(batch.qo_indptr[1:], 1, out=self.last_token_idx)
        hidden = self.model.forward_extend(batch.input_ids, batch.positions, self.kv_caches, batch)
        logits = self.model.compute_logits(hidden[self.last_token_idx])
        if self.eos_table is None:
            self.eos_table = torch.full((1,), c.eos_token_id, dtype=torch.int64, device=self.device)  # ok: FC107
        next_ids = torch.where(batch.seq_lens >= c.max_seq_len, self.eos_table, torch.argmax(logits, dim=-1))  # ok: FC101
        # these requests decode next step: seed the decode indptr with their page counts
        pages = (batch.seq_lens + c.page_size - 1) // c.page_size
        torch.cumsum(pages, 0, out=self.backend.kv_indptr[1 : bs + 1])  # expect: FC104
        if self.done_cpu.numel() < bs:  # ok: FC101
            self.done_cpu = torch.zeros(bs, dtype=torch.bool, pin_memory=True)  # ok: FC107
        self.done_cpu[:bs].copy_(next_ids == self.eos_table, non_blocking=True)  # ok: FC101
        self.done_event.record()
        self._plan_info["extend"] += 1
        return next_ids
    def shrink_scratch_for_retry(self):
        """Called by @retry_on_oom between attempts: halve the split-k workspace."""
        ws = self.backend.workspace
        assert ws.numel() >= 64 << 20, "split-k workspace already at its floor"  # ok: FC109
        self.backend.workspace.resize_(ws.numel() // 2)  # expect: FC107
        self.backend.decode_wrapper._float_workspace_buffer = self.backend.workspace  # expect: FC103
    def dump_state(self) -> dict:
        """Debug endpoint /debug/state; never called on the step."""
        return {"free_slots": self.free_slots.tolist(), "steps": self._plan_info,  # ok: FC101
                "prefill_qo_indptr": self.backend.prefill_wrapper._qo_indptr_buf}  # expect: FC103
