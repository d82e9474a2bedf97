"""The attention rank's decode loop and its CUDA graphs (one per micro-batch slot and bucket)."""

from __future__ import annotations

import logging
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from flashinfer.norm import rmsnorm
from flashinfer.rope import apply_rope_with_cos_sin_cache_inplace
from torch import nn

from afd.attention.mb_attention import MicroBatchAttention
from afd.attention.microbatch import DecodeRow, MicroBatch, split_microbatches
from afd.comm.m2n import M2NSender
from afd.topology import AFDTopology

logger = logging.getLogger(__name__)


class AttnLayer(nn.Module):
    def __init__(self, topo: AFDTopology, idx: int, device, dtype=torch.bfloat16):
        super().__init__()
        self.idx = idx
        self.topo = topo
        h, kv, d = topo.num_qo_heads, topo.num_kv_heads, topo.head_dim
        self.sizes = (h * d, kv * d, kv * d)
        self.qkv_proj = nn.Linear(topo.hidden_size, sum(self.sizes), bias=False, device=device, dtype=dtype)
        self.o_proj = nn.Linear(h * d, topo.hidden_size, bias=False, device=device, dtype=dtype)
        self.ln = nn.Parameter(torch.ones(topo.hidden_size, device=device, dtype=dtype))

    def qkv(self, h: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor):
        q, k, v = self.qkv_proj(rmsnorm(h, self.ln)).split(self.sizes, dim=-1)
        apply_rope_with_cos_sin_cache_inplace(positions, q, k, self.topo.head_dim, cos_sin, is_neox=True)
        d = self.topo.head_dim
        return q.view(h.shape[0], -1, d), k.view(h.shape[0], -1, d), v.view(h.shape[0], -1, d)

    def post_attn(self, h: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        return h + self.o_proj(o.reshape(h.shape[0], -1))


class AttnWorker:
    def __init__(self, topo: AFDTopology, ffn_group: Optional[dist.ProcessGroup], device: str = "cuda",
                 num_pages: int = 32768, use_trtllm: bool = False):
        topo.check()
        self.topo = topo
        self.device = torch.device(device)
        dev = self.device
        self.attn = MicroBatchAttention(topo, dev, use_trtllm=use_trtllm)
        self.buckets = self.attn._bucket_table()
        self.pad_to_bucket = self.attn._backend == "fa2"  # ok: FC103
        self.m2n = M2NSender(topo, ffn_group, dev)
        self.layers = nn.ModuleList([AttnLayer(topo, i, dev) for i in range(topo.num_layers)])
        self.embed = nn.Embedding(topo.vocab_size, topo.hidden_size, device=dev, dtype=torch.bfloat16)
        self.lm_head = nn.Linear(topo.hidden_size, topo.vocab_size, bias=False, device=dev, dtype=torch.bfloat16)
        self.kv = [
            torch.zeros(num_pages, 2, topo.page_size, topo.num_kv_heads, topo.head_dim, dtype=torch.bfloat16, device=dev)
            for _ in range(topo.num_layers)
        ]
        d = topo.head_dim
        inv = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float32, device=dev) / d))
        f = torch.outer(torch.arange(topo.max_context_len, dtype=torch.float32, device=dev), inv)
        self.cos_sin = torch.cat([f.cos(), f.sin()], dim=-1)
        self.tail_index = topo.num_microbatches - 1 if topo.uneven_tail else -1
        self.streams = (torch.cuda.Stream(dev), torch.cuda.Stream(dev))
        self.graphs = AttnGraphs(self)
        self.graphs.record_all()

    def _write_kv(self, layer_idx: int, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor) -> None:
        ps = self.topo.page_size
        cache = self.kv[layer_idx]
        cache[slots // ps, 0, slots % ps] = k
        cache[slots // ps, 1, slots % ps] = v

    def forward_mb(self, i: int, mb: MicroBatch, input_ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer in self.layers:
            q, k, v = layer.qkv(h, mb.positions, self.cos_sin)
            self._write_kv(layer.idx, k, v, mb.slots)
            if i == self.tail_index:
                o = self.attn.attend_tail(q, self.kv[layer.idx])
            else:
                o = self.attn.attend(i, q, self.kv[layer.idx], mb)
            h = layer.post_attn(h, o)
            h = h + self.m2n.exchange(h, layer.idx)
        return self.lm_head(h)

    def step(self, rows: Sequence[DecodeRow]) -> List[torch.Tensor]:
        t = self.topo
        mbs = list(split_microbatches(rows, t.num_microbatches, self.buckets, t.page_size, self.device))
        for i, mb in enumerate(mbs):
            if i == self.tail_index:
                self.attn.plan_tail(mb)
            else:
                self.attn.plan_microbatch(i, mb)
        outs: List[torch.Tensor] = []
        for i, mb in enumerate(mbs):
            # ping-pong: micro-batch i's attention overlaps micro-batch i-1's expert round trip
            with torch.cuda.stream(self.streams[i % 2]):
                if mb.bucket is not None:
                    outs.append(self.graphs.replay(i, mb))
                else:
                    outs.append(self.forward_mb(i, mb, mb.input_ids))
        # the FFN ranks report dropped tokens (expert capacity) per micro-batch
        self.m2n.comm_stream.synchronize()  # expect: FC101
        dropped = self.m2n.overflow_cpu[: len(mbs)].tolist()
        if any(dropped):
            logger.warning("expert capacity overflow in micro-batches %s", [i for i, d in enumerate(dropped) if d])
        # the next step reuses this step's plan with one more token per row
        for i, mb in enumerate(mbs):
            if mb.bucket is not None and i != self.tail_index:
                self.attn.kv_last_page_gpu[i, : mb.size].add_(1)  # expect: FC104
        return outs

    def prefill(self, prompt_lens: Sequence[int]) -> None:
        indptr = [0]
        for n in prompt_lens:
            indptr.append(indptr[-1] + n)
        self.attn.prefill_plan_host(torch.tensor(indptr, dtype=torch.int32))


class AttnGraphs:
    def __init__(self, worker: AttnWorker):
        self.worker = worker
        self.topo = worker.topo
        m, max_bs = self.topo.num_microbatches, self.topo.max_mb_size
        self.static_ids = [torch.zeros(max_bs, dtype=torch.int64, device=worker.device) for _ in range(m)]
        self.static_out = [torch.zeros(max_bs, self.topo.vocab_size, dtype=torch.bfloat16, device=worker.device) for _ in range(m)]
        self.static_pos = [torch.zeros(max_bs, dtype=torch.int64, device=worker.device) for _ in range(m)]
        self.static_slots = [torch.zeros(max_bs, dtype=torch.int64, device=worker.device) for _ in range(m)]
        self.graphs: Dict[Tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.pool = None

    def dummy_microbatch(self, i: int, bs: int) -> MicroBatch:
        return MicroBatch(
            index=i,
            size=bs,
            bucket=bs,
            input_ids=self.static_ids[i][:bs],
            positions=self.static_pos[i][:bs],
            slots=self.static_slots[i][:bs],
            seq_lens_list=[1] * bs,
            kv_indptr_cpu=torch.arange(bs + 1, dtype=torch.int32).pin_memory(),
            kv_indptr=torch.arange(bs + 1, dtype=torch.int32, device=self.worker.device),
            kv_indices=torch.zeros(bs, dtype=torch.int32, device=self.worker.device),
            last_page_cpu=torch.ones(bs, dtype=torch.int32).pin_memory(),
        )

    def record_all(self) -> None:
        for i in range(self.topo.num_microbatches):
            for bs in sorted(self.topo.buckets, reverse=True):
                self.record(i, bs)

    def record(self, i: int, bs: int) -> None:
        mb = self.dummy_microbatch(i, bs)
        if int(mb.kv_indptr[-1]) != bs:  # expect: FC101
            raise RuntimeError("dummy micro-batch must read one null page per row")
        self.worker.attn.plan_microbatch(i, mb)
        w = self.worker.attn.graph_wrappers[i][bs]
        if len(w._paged_kv_indices_buf) < bs:  # expect: FC103
            raise RuntimeError(f"indices buffer of micro-batch slot {i} too small for bucket {bs}")
        self.worker.m2n.comm_stream.synchronize()  # ok: FC101
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool):
            out = self.worker.forward_mb(i, mb, self.static_ids[i][:bs])
            self.static_out[i][:bs].copy_(out)
        if self.pool is None:
            self.pool = g.pool()
        self.graphs[(i, bs)] = g

    def replay(self, i: int, mb: MicroBatch) -> torch.Tensor:
        n = mb.size
        self.static_ids[i][:n].copy_(mb.input_ids)
        self.static_pos[i][:n].copy_(mb.positions)
        self.static_slots[i][:n].copy_(mb.slots)
        self.graphs[(i, mb.bucket)].replay()
        out = self.static_out[i][:n]
        # hand the caller this replay's logits; the next replay of slot i writes a fresh buffer
        self.static_out[i] = torch.empty_like(self.static_out[i])  # expect: FC107
        return out
