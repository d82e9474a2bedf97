"""Ring-attention prefill.

Every ring step runs this rank's queries against the KV block it holds, then
passes the block on.  Each step leaves a partial output and its LSE in one
column of ``v_parts`` / ``s_parts`` (rows that skip a step keep LSE = -inf),
and ``merge_states`` folds the columns together at the end.
"""
from __future__ import annotations

from typing import Dict, List, Optional

import torch
from flashinfer import BatchPrefillWithRaggedKVCacheWrapper, merge_states

from cpring.forward_batch import CPForwardBatch
from cpring.parallel.layout import RingStepShape, chunk_rows, ring_step_shapes
from cpring.parallel.ring_comm import RingComm


class RingStepMeta:
    """Built once per extend batch; owns that batch's partial states."""

    def __init__(self, num_tokens: int, cp_size: int, num_heads: int, head_dim: int,
                 shapes: List[RingStepShape], lo_rows: torch.Tensor, hi_rows: torch.Tensor):
        device = lo_rows.device
        self.v_parts = torch.zeros(num_tokens, cp_size, num_heads, head_dim, dtype=torch.bfloat16, device=device)  # ok: FC107
        self.s_parts = torch.full((num_tokens, cp_size, num_heads), float("-inf"), dtype=torch.float32, device=device)
        self.shapes = shapes
        self.lo_rows = lo_rows
        self.hi_rows = hi_rows


class RingPrefillAttention:
    RING_WS_BYTES = 256 << 20

    def __init__(self, comm: RingComm, num_qo_heads: int, num_kv_heads: int, head_dim: int, device: torch.device):
        self.comm = comm
        self.cp_size = comm.world
        self.rank = comm.rank
        self.num_qo_heads = num_qo_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.device = device
        self._kv_layout = "NHD"  # ok: FC103
        self.float_ws = torch.empty(self.RING_WS_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.step_wrappers = [
            BatchPrefillWithRaggedKVCacheWrapper(self.float_ws, self._kv_layout, backend="fa2")
            for _ in range(self.cp_size)
        ]
        self.step_meta: Optional[RingStepMeta] = None
        self._check_ring()

    def _check_ring(self) -> None:
        assert len(self.step_wrappers) == self.cp_size == self.comm.world  # ok: FC109

    def plan_ring_steps(self, fb: CPForwardBatch) -> None:
        """Plan every ring step of this extend batch before the first KV block moves."""
        H, KVH, D = self.num_qo_heads, self.num_kv_heads, self.head_dim
        bs = fb.batch_size
        seq_lens = fb.seq_lens_cpu.tolist()
        shapes = ring_step_shapes(seq_lens, self.cp_size, self.rank)
        num_tokens = int(fb.local_lens.sum())  # expect: FC101
        lo_rows = torch.tensor(chunk_rows(seq_lens, self.cp_size, second=False), device=self.device)
        hi_rows = torch.tensor(chunk_rows(seq_lens, self.cp_size, second=True), device=self.device)
        self.step_meta = RingStepMeta(num_tokens, self.cp_size, H, D, shapes, lo_rows, hi_rows)

        # step 0: causal over the rank's own two chunks
        qo_indptr = torch.zeros(bs + 1, dtype=torch.int32, device=self.device)
        torch.cumsum(fb.local_lens, 0, dtype=torch.int32, out=qo_indptr[1:])
        self.step_wrappers[0].plan(  # expect: FC102
            qo_indptr, qo_indptr, H, KVH, D, causal=True, q_data_type=torch.bfloat16
        )

        # steps 1..cp-1 fall into two shape classes (peer before / after this rank)
        classes: Dict[bool, List[RingStepShape]] = {False: [], True: []}
        for shape in shapes[1:]:
            classes[shape.hi_only].append(shape)
        for group in classes.values():
            if not group:
                continue
            lead = self.step_wrappers[group[0].step]
            lead.plan(  # ok: FC102
                torch.from_numpy(group[0].qo_indptr), torch.from_numpy(group[0].kv_indptr), H, KVH, D,
                causal=False, q_data_type=torch.bfloat16,
            )
            # identical ragged shapes: hand the lead's plan to the other steps of the class
            info = lead._plan_info  # expect: FC103
            for shape in group[1:]:
                self.step_wrappers[shape.step]._plan_info = info  # expect: FC103

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q, k, v: this rank's tokens, [lo, hi] per request."""
        meta = self.step_meta
        block = torch.stack([k, v])
        for shape in meta.shapes:
            last = shape.step + 1 == self.cp_size
            if not last:
                incoming = self.comm.send_recv(block)
                self.comm.commit()
            w = self.step_wrappers[shape.step]
            if shape.causal:
                o, lse = w.run(q, block[0], block[1], return_lse=True)
                meta.v_parts[:, shape.step] = o
                meta.s_parts[:, shape.step] = lse
            elif shape.hi_only:
                o, lse = w.run(q[meta.hi_rows], block[0], block[1], return_lse=True)
                meta.v_parts[meta.hi_rows, shape.step] = o
                meta.s_parts[meta.hi_rows, shape.step] = lse
            else:
                kv_lo = block[:, meta.lo_rows]
                o, lse = w.run(q, kv_lo[0], kv_lo[1], return_lse=True)
                meta.v_parts[:, shape.step] = o
                meta.s_parts[:, shape.step] = lse
            if not last:
                self.comm.wait()
                block = incoming
        out, _ = merge_states(meta.v_parts, meta.s_parts)
        return out
