"""One CUDA graph per (micro-batch slot, bucket) over all pipeline stages, and its per-step preparation."""
import functools
import itertools
import operator
from types import SimpleNamespace
from typing import Dict, List, Optional, Tuple

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper

from ppengine import DECODE_BUCKETS, PAGE_SIZE, MicroBatch, PipelineConfig, SlotBuffers, build_page_table
from stages.stage import PipelineStage, StageMeta

_eager_decode_of = operator.attrgetter("attn.decode_wrapper")
_STATIC_INPUTS = (("static_seq_lens", "seq_lens"), ("static_positions", "positions"))
_FIXED_BS = "_fixed_batch_size"


def _fold(stages: List[PipelineStage], hidden: torch.Tensor, meta: StageMeta, method: str) -> torch.Tensor:
    """hidden -> stage 0 -> stage 1 -> ...: one micro-batch's trip through the pipeline."""
    return functools.reduce(lambda h, stage: operator.methodcaller(method, h, meta)(stage), stages, hidden)


def _pad_last_page(last_page_len: torch.Tensor, n: int, bs: int) -> None:
    last_page_len[n:bs].fill_(1)


class MicroBatchGraphRunner:
    DRAFT_WS_BYTES = 32 << 20

    def __init__(self, cfg: PipelineConfig, stages: List[PipelineStage], req_to_page: torch.Tensor):
        self.cfg, self.stages, self.req_to_page = cfg, stages, req_to_page
        dev, kw, qd = cfg.device, dict(device=cfg.device, dtype=torch.bfloat16), cfg.num_qo_heads * cfg.head_dim
        self.slots = [SlotBuffers.allocate(cfg) for _ in range(cfg.max_micro_batches)]
        draft_ws = torch.zeros(self.DRAFT_WS_BYTES, dtype=torch.uint8, device=dev)  # expect: FC106
        self.draft_wrapper = BatchDecodeWithPagedKVCacheWrapper(draft_ws, "NHD")  # MTP head: own KV layer, eager
        self.draft_kv = torch.zeros(cfg.max_pages, 2, PAGE_SIZE, cfg.num_kv_heads, cfg.head_dim, **kw)
        self.mtp_q, self.mtp_o = (torch.nn.Linear(cfg.hidden_size, qd, bias=False, **kw),
                                  torch.nn.Linear(qd, cfg.hidden_size, bias=False, **kw))
        p2p_bytes = cfg.max_micro_batches * cfg.max_batch_per_mb * cfg.hidden_size * 2
        self.p2p_workspace = torch.zeros(p2p_bytes, dtype=torch.uint8, device=dev)  # ok: FC106
        self.static_seq_lens = self.static_positions = None  # graph inputs, allocated by record_all()
        self.graphs: Dict[Tuple[int, int], SimpleNamespace] = {}  # graph, hidden_in, hidden_out
        self._plan_info: Dict[int, Tuple[int, int]] = {}
        self._captured = False
        for m, bufs in enumerate(self.slots):
            bufs.kv_indptr.zero_()  # ok: FC104
            self.init_slot_state(m)
            for stage in stages:
                stage.attn.init_graph_wrappers(m, bufs, DECODE_BUCKETS)

    def init_slot_state(self, m: int) -> None:
        self.slots[m].kv_indices.zero_()  # ok: FC104

    def record_all(self) -> None:
        """Capture every (slot, bucket) graph, largest bucket first so the smaller ones reuse the pool."""
        assert not self._captured, "graphs are captured once"  # ok: FC109
        assert max(DECODE_BUCKETS) <= self.cfg.max_batch_per_mb, "bucket above max_batch_per_mb"  # ok: FC109
        bs, dev = self.cfg.max_batch_per_mb, self.cfg.device
        self.static_seq_lens = torch.ones(bs, dtype=torch.int32, device=dev)  # ok: FC107
        self.static_positions = torch.zeros(bs, dtype=torch.int64, device=dev)
        torch.cuda.synchronize()  # ok: FC101
        pool = torch.cuda.graph_pool_handle()
        for m, b in itertools.product(range(self.cfg.max_micro_batches), sorted(DECODE_BUCKETS, reverse=True)):
            self.graphs[(m, b)] = self.capture_slot(m, b, pool)
        self._captured = True

    def _check_bucket(self, bs: int) -> None:
        assert bs in DECODE_BUCKETS, f"bucket {bs} is not configured"  # expect: FC109

    def capture_slot(self, m: int, bs: int, pool) -> SimpleNamespace:
        self._check_bucket(bs)
        bufs = self.slots[m]
        bufs.kv_indptr_cpu[: bs + 1] = torch.arange(bs + 1, dtype=torch.int32)
        bufs.hidden[:bs].zero_()  # ok: FC104
        meta = self._graph_meta(m, bs, None)
        for stage in self.stages:
            w = stage.attn.graph_decode[m][bs]
            if getattr(w, _FIXED_BS) != bs:  # expect: FC103
                raise RuntimeError(f"slot {m}: the bucket-{bs} wrapper was built for another batch size")
            plan = functools.partial(w.plan, **dict(zip(("num_qo_heads", "num_kv_heads", "head_dim"), stage.attn.dims)))
            plan(bufs.kv_indptr_cpu[: bs + 1], bufs.kv_indices[:bs], bufs.kv_last_page_len_cpu[:bs], page_size=PAGE_SIZE)  # ok: FC102
        self.plan_draft(meta)
        warm = self._draft_step(_fold(self.stages, bufs.hidden[:bs], meta, "forward_decode"), meta)
        if torch.isnan(warm).any():  # expect: FC101
            raise RuntimeError(f"slot {m} bucket {bs}: warm-up produced NaN")
        torch.cuda.current_stream().synchronize()  # ok: FC101
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            out = self._draft_step(_fold(self.stages, bufs.hidden[:bs], meta, "forward_decode"), meta)
        return SimpleNamespace(graph=graph, hidden_in=bufs.hidden[:bs], hidden_out=out)

    def _draft_step(self, hidden: torch.Tensor, meta: StageMeta) -> torch.Tensor:
        """MTP head inside the slot graph: its own KV layer plus the last stage's last layer."""
        q = self.mtp_q(hidden).view(-1, self.cfg.num_qo_heads, self.cfg.head_dim)
        d = self.draft_wrapper.run(q, self.draft_kv)  # expect: FC108
        v = _eager_decode_of(self.stages[-1]).run(q, self.stages[-1].kv_caches[-1])  # expect: FC108
        return hidden + self.mtp_o((d + v).flatten(1))

    def _graph_meta(self, m: int, bs: int, mb: Optional[MicroBatch]) -> StageMeta:
        bufs, qo_cpu = self.slots[m], mb.qo_indptr_cpu if mb else torch.arange(bs + 1, dtype=torch.int32)
        return StageMeta(m, mb.num_reqs if mb else bs, bs, True, self.static_seq_lens[:bs], self.static_positions[:bs],
                         bufs.kv_indptr[: bs + 1], bufs.kv_indices, bufs.kv_last_page_len[:bs],
                         bufs.kv_indptr_cpu[: bs + 1], bufs.kv_last_page_len_cpu[:bs], qo_cpu)

    def prepare_micro_batches(self, mbs: List[MicroBatch]) -> List[StageMeta]:
        metas = [self._prepare_slot(mb) for mb in mbs]
        for bufs in itertools.islice(self.slots, len(mbs)):
            bufs.kv_indptr.copy_(bufs.kv_indptr_cpu, non_blocking=True)  # expect: FC104
        return metas

    def _prepare_slot(self, mb: MicroBatch) -> StageMeta:
        n = mb.num_reqs
        if n > self.cfg.max_batch_per_mb:
            raise ValueError(f"micro-batch of {n} rows > max_batch_per_mb; seq_lens={mb.seq_lens}")  # ok: FC101
        bs = next((b for b in DECODE_BUCKETS if b >= n), None)  # ok: FC101
        if bs is None or mb.is_prefill:  # ok: FC101
            return self._prepare_eager(mb)
        bufs, nnz = self.slots[mb.slot], len(mb.indices_h)
        if nnz > bufs.kv_indices.numel():
            bufs.kv_indices.resize_(nnz)  # expect: FC107
        bufs.kv_indptr_cpu[: n + 1] = torch.from_numpy(mb.indptr_h)  # ok: FC104
        bufs.kv_indptr_cpu[n + 1 : bs + 1] = int(bufs.kv_indptr_cpu[n])  # ok: FC101
        bufs.kv_last_page_len_cpu[:n] = torch.from_numpy(mb.last_h)
        bufs.kv_last_page_len_cpu[n:bs] = 1
        bufs.kv_indices[:nnz].copy_(torch.from_numpy(mb.indices_h), non_blocking=True)  # ok: FC104
        meta = self._graph_meta(mb.slot, bs, mb)
        for stage in self.stages:
            self.plan_stage_decode(stage, mb.slot, bs, nnz)
            if self.cfg.shared_prefix_pages:
                stage.attn.plan_shared_prefix(meta)
        self.plan_windows(meta)
        self.plan_draft(meta)
        _pad_last_page(bufs.kv_last_page_len, n, bs)  # expect: FC104
        self.static_seq_lens[:n].copy_(mb.seq_lens)  # ok: FC104
        return meta

    def _prepare_eager(self, mb: MicroBatch) -> StageMeta:
        """Prefill micro-batches, and decode micro-batches above every bucket, run without graphs."""
        if mb.indices_h.max(initial=0) >= self.draft_kv.shape[0]:  # the page pool grew since start-up
            self.draft_kv = torch.cat([self.draft_kv, torch.zeros_like(self.draft_kv)])  # expect: FC107
        indptr, indices, last = build_page_table(mb.seq_lens, self.req_to_page, mb.rows)
        meta = StageMeta(mb.slot, mb.num_reqs, None, False, mb.seq_lens, mb.positions, indptr, indices, last,
                         *map(torch.from_numpy, (mb.indptr_h, mb.last_h)), mb.qo_indptr_cpu, mb.qo_indptr,
                         is_prefill=mb.is_prefill, no_prefix=mb.no_prefix)
        if mb.is_prefill:
            for stage in self.stages:
                stage.attn.plan_extend(meta)
            return meta
        self.plan_draft(meta)
        if self.cfg.decode_backend == "trtllm-gen":
            meta.block_tables = self.req_to_page[mb.rows].clone()  # ok: FC107
            meta.max_seq_len = int(mb.seq_lens.cpu().max())  # expect: FC101
            return meta
        for stage, decode in zip(self.stages, map(_eager_decode_of, self.stages)):
            decode.plan(indptr, indices, last, *stage.attn.dims, PAGE_SIZE)  # expect: FC102
            if self.cfg.shared_prefix_pages:
                stage.attn.plan_shared_prefix(meta)
        self.plan_windows(meta)
        return meta

    def plan_stage_decode(self, stage: PipelineStage, m: int, bs: int, nnz: int) -> None:
        bufs, (hq, hk, d) = self.slots[m], stage.attn.dims
        stage.attn.ensure_graph_workspace(m, nnz * hq * d * 8)
        bufs.kv_indptr[: bs + 1].copy_(bufs.kv_indptr_cpu[: bs + 1], non_blocking=True)  # ok: FC104
        stage.attn.graph_decode[m][bs].plan(  # ok: FC102
            bufs.kv_indptr_cpu[: bs + 1], bufs.kv_indices[:nnz], bufs.kv_last_page_len_cpu[:bs], hq, hk, d, PAGE_SIZE,
            sm_scale=stage._sm_scale,  # ok: FC103
        )
        self._plan_info[m] = (bs, nnz)  # ok: FC103

    def plan_windows(self, meta: StageMeta) -> None:
        """Sliding-window layers of every stage share one page table; the kernel clips with window_left."""
        if not self.cfg.window_layers:
            return
        replan = operator.methodcaller("plan", meta.kv_indptr, meta.kv_indices, meta.kv_last_page_len_cpu,  # expect: FC102
                                       *self.stages[0].attn.dims, PAGE_SIZE, window_left=self.cfg.window_size)
        for window in map(operator.attrgetter("attn.window_wrapper"), self.stages):
            replan(window)

    def plan_draft(self, meta: StageMeta) -> None:
        n = meta.num_reqs
        args = (meta.kv_indptr[: n + 1], meta.kv_indices, meta.kv_last_page_len_cpu[:n])
        self.draft_wrapper.plan(*args, self.cfg.num_qo_heads, self.cfg.num_kv_heads, self.cfg.head_dim, PAGE_SIZE)  # expect: FC102

    def replay(self, mbs: List[MicroBatch], metas: List[StageMeta], hiddens: List[torch.Tensor]) -> List[torch.Tensor]:
        assert self._captured, "record_all() must run before replay()"  # ok: FC109
        outs = []
        for mb, meta, hidden in zip(mbs, metas, hiddens):
            for dst, src in _STATIC_INPUTS:
                setattr(self, dst, getattr(mb, src).clone())  # expect: FC107
            entry = self.graphs[(mb.slot, meta.bucket)]
            entry.hidden_in = hidden.clone()  # expect: FC107
            entry.graph.replay()
            outs.append(entry.hidden_out[: mb.num_reqs])  # ok: FC101
        return outs

    def run_eager(self, mb: MicroBatch, meta: StageMeta, hidden: torch.Tensor) -> torch.Tensor:
        out = _fold(self.stages, hidden, meta, "forward")
        if mb.is_prefill:
            return out
        q = self.mtp_q(out).view(-1, self.cfg.num_qo_heads, self.cfg.head_dim)
        if sum(meta.seq_lens == 0):  # expect: FC101
            q = q * (meta.seq_lens > 0)[:, None, None]  # padding rows get no draft
        return out + self.mtp_o(self.draft_wrapper.run(q, self.draft_kv).flatten(1))  # ok: FC108

    def plan_stats(self) -> Dict[str, object]:
        wrappers = [w for s in self.stages for per_bs in s.attn.graph_decode.values() for w in per_bs.values()]
        eager = map(_eager_decode_of, self.stages)
        infos = list(map(operator.attrgetter("_plan_info"), wrappers))  # expect: FC103
        assert len(infos) == len(wrappers)  # ok: FC109
        layouts = {w._kv_layout for s in self.stages for d in s.attn.graph_decode.values() for _, w in d.items()}  # expect: FC103
        return {"planned": sum(info is not None for info in infos), "layouts": sorted(layouts),
                "graph_mode": sum(w.is_cuda_graph_enabled for w in wrappers),  # ok: FC103
                "bound_indptr": sum(vars(w).get("_paged_kv_indptr_buf") is not None for w in wrappers),  # expect: FC103
                "float_ws": sum(w._float_workspace_buffer.numel() for w in itertools.chain(wrappers, eager))}  # expect: FC103

    def defragment(self, remap: torch.Tensor) -> None:
        """Page compaction moved KV pages: rewrite every slot's page ids through the remap table."""
        for bufs in self.slots:
            moved = bufs.kv_indices.clone()
            moved.copy_(remap[moved.long()])  # ok: FC104
            bufs.kv_indices.copy_(moved)  # expect: FC104
