"""The CPU reference target: an engine-shaped harness around fp32 reference attention, for CI.

It behaves like a serving backend (persistent per-bucket metadata buffers, a split-KV float workspace from the
arena, "graphs" that read the persistent buffers at replay time, padding by policy) so that the driver, every
property and the faulty variants in ``tests/quality`` run without a GPU. It is never evidence for a GPU claim.
Metadata as a kernel reads it runs every request at once; anything else runs request by request, so that malformed
metadata misbehaves as it always did (`ReferenceTarget._attend`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from flashcheck.batch import BatchSpec
from flashcheck.layout import PaddingPolicy, PagedLayout
from flashcheck.properties.csr import CsrInput
from flashcheck.targets.protocol import Capacity, TargetEnv

__all__ = ["ReferenceTarget"]

# What `_batched` does in one go; a subclass that changes one of them runs request by request.
_KERNEL_METHODS = ("_request", "partial_offset", "_write_partials", "_read_partials", "_batched", "_well_formed")


@dataclass
class _Graph:
    bucket: int
    real_batch: int = 0
    real_rows: int = 0


class ReferenceTarget:
    """fp32 paged attention with split-KV partials in a workspace; graphs emulated over persistent buffers.

    Args:
        buckets: graph buckets (ascending).
        padding: padding policy for graph batches.
        chunk: KV tokens per split-KV chunk (partials go to the float workspace).
        template: heads/dims/page size of every batch.
    """

    name = "cpu-reference"

    def __init__(
        self,
        *,
        buckets: tuple[int, ...] = (1, 2, 4, 8),
        padding: str = "vllm_legacy",
        chunk: int = 64,
        template: BatchSpec | None = None,
        max_pages: int = 512,
        max_kv_len: int = 1024,
        max_qo_len: int = 16,
    ) -> None:
        tpl = template or BatchSpec(
            (1,),
            (1,),
            page_size=16,
            num_qo_heads=4,
            num_kv_heads=2,
            head_dim_qk=16,
            head_dim_vo=16,
            q_dtype="float32",
            kv_dtype="float32",
        )
        self.chunk = chunk
        self.capacity = Capacity(
            template=tpl,
            max_batch_size=max(buckets) if buckets else 8,
            max_pages=max_pages,
            max_qo_len=max_qo_len,
            max_kv_len=max_kv_len,
            max_total_qo=(max(buckets) if buckets else 8) * max_qo_len,
            buckets=tuple(buckets),
            padding=PaddingPolicy.parse(padding),
        )
        self._graphs: dict[int, _Graph] = {}
        self._eager: PagedLayout | None = None

    # ---- protocol --------------------------------------------------------------------------------------------
    def config(self) -> Mapping[str, Any]:
        c = self.capacity
        return {
            "buckets": list(c.buckets),
            "padding": c.padding.value,
            "chunk": self.chunk,
            "template": c.template.to_dict(),
            "max_pages": c.max_pages,
            "max_kv_len": c.max_kv_len,
            "max_qo_len": c.max_qo_len,
        }

    def setup(self, env: TargetEnv) -> None:
        import torch

        self.torch = torch
        self.env = env
        c, t = self.capacity, self.capacity.template
        rows = self.workspace_rows()
        chunks = -(-c.max_kv_len // self.chunk)
        nbytes = rows * t.num_qo_heads * chunks * (t.head_dim_vo + 1) * 4
        self.workspace = env.arena.workspace("float_workspace", nbytes, device=env.device, kind="float", zero=False)
        self.bufs: dict[int, dict[str, Any]] = {}
        for b in c.buckets:
            self.bufs[b] = {
                "qo_indptr": torch.zeros(b + 1, dtype=torch.int32, device=env.device),
                "kv_indptr": torch.zeros(b + 1, dtype=torch.int32, device=env.device),
                "kv_last_page_len": torch.zeros(b, dtype=torch.int32, device=env.device),
            }
        self.kv_indices = torch.zeros(c.max_pages, dtype=torch.int32, device=env.device)
        self.static_q = torch.zeros(
            (c.max_total_qo + max(c.buckets, default=0), t.num_qo_heads, t.head_dim_qk),
            dtype=env.k_cache.dtype,
            device=env.device,
        )

    def workspace_rows(self) -> int:
        """Rows of partials the workspace is sized for (the formula faulty variants get wrong)."""
        return self.capacity.max_total_qo + max(self.capacity.buckets, default=0)

    def plan(self, layout: PagedLayout) -> None:
        self._eager = layout

    def run(self, q: Any) -> Any:
        if self._eager is None:
            raise RuntimeError("run() before plan()")
        lay = self._eager
        t = self.torch
        return self._attend(
            q,
            t.as_tensor(lay.qo_indptr),
            t.as_tensor(lay.kv_indptr),
            t.as_tensor(lay.kv_indices),
            t.as_tensor(lay.kv_last_page_len),
            lay.batch_size,
        )

    def capture(self, bucket: int, layout: PagedLayout, q: Any) -> None:
        self._graphs[bucket] = _Graph(bucket)
        self.prepare_replay(bucket, layout)

    def prepare_replay(self, bucket: int, layout: PagedLayout) -> None:
        b, t = self.bufs[bucket], self.torch
        b["qo_indptr"].copy_(t.as_tensor(layout.qo_indptr))
        b["kv_indptr"].copy_(t.as_tensor(layout.kv_indptr))
        b["kv_last_page_len"].copy_(t.as_tensor(layout.kv_last_page_len))
        self.kv_indices[: len(layout.kv_indices)].copy_(t.as_tensor(layout.kv_indices))
        g = self._graphs[bucket]
        g.real_batch, g.real_rows = layout.batch_size, layout.real_qo_rows()

    def replay(self, bucket: int, q: Any) -> Any:
        g, b = self._graphs[bucket], self.bufs[bucket]
        self.static_q[: q.shape[0]].copy_(q)
        # the "graph" reads the persistent buffers as they are now, padded rows included
        out = self._attend(
            self.static_q, b["qo_indptr"], b["kv_indptr"], self.kv_indices, b["kv_last_page_len"], bucket
        )
        self.after_replay(bucket)
        return out[: g.real_rows]

    def after_replay(self, bucket: int) -> None:
        """What the captured forward does after attention (faulty variants write persistent buffers here)."""

    def graph_metadata(self, bucket: int) -> CsrInput | None:
        b, c = self.bufs[bucket], self.capacity
        return CsrInput(
            kv_indptr=b["kv_indptr"],
            kv_indices=self.kv_indices,
            kv_last_page_len=b["kv_last_page_len"],
            num_pages=c.max_pages,
            page_size=c.template.page_size,
            qo_indptr=b["qo_indptr"],
            batch_size=self._graphs[bucket].real_batch,
            padding=c.padding,
            kv_indices_len=c.max_pages,
        )

    def plan_info(self, bucket: int) -> list[int] | None:
        return [bucket, self.chunk, -(-self.capacity.max_kv_len // self.chunk)]

    def teardown(self) -> None:
        self._graphs.clear()

    # ---- the "kernel" ----------------------------------------------------------------------------------------
    def _attend(self, q: Any, qo: Any, kv: Any, indices: Any, last: Any, n: int) -> Any:
        """Split-KV attention: per-chunk partials (o, lse) written to the workspace, then merged from it. Metadata
        that a kernel reads as intended (monotone indptrs within their buffers, last-page lengths in ``1..page``,
        pages in the cache, no more chunks than a workspace row holds) runs every request at once (`_batched`);
        anything else runs request by request, so malformed metadata does exactly what it did (overlapping rows,
        partials past a row's slot, an index error where the kernel would read out of bounds)."""
        t = self.torch
        spec = self.capacity.template
        qo_l, kv_l, last_l, idx = qo.tolist(), kv.tolist(), last.tolist(), indices.long()
        rows = int(qo_l[n])
        out = t.zeros((rows, spec.num_qo_heads, spec.head_dim_vo), dtype=t.float32, device=q.device)
        page = spec.page_size
        reqs = self._well_formed(qo_l, kv_l, last_l, n, q.shape[0], idx)
        if reqs is not None:
            if reqs:
                self._batched(q, idx, reqs, out)
            return out.to(q.dtype)
        for i in range(n):
            q0, q1, p0, p1 = qo_l[i], qo_l[i + 1], kv_l[i], kv_l[i + 1]
            if q1 <= q0 or p1 <= p0:
                continue
            length = (p1 - p0 - 1) * page + last_l[i]
            ids = idx[p0:p1]
            k = self.env.k_cache[ids].reshape(-1, *self.env.k_cache.shape[2:])[:length].float()
            v = self.env.v_cache[ids].reshape(-1, *self.env.v_cache.shape[2:])[:length].float()
            out[q0:q1] = self._request(q[q0:q1].float(), k, v, q0)
        return out.to(q.dtype)

    def _well_formed(
        self, qo: list[int], kv: list[int], last: list[int], n: int, q_rows: int, idx: Any
    ) -> list[tuple[int, int, int, int, int]] | None:
        """``(q0, q1, p0, p1, kv_len)`` of each request with rows and pages when the metadata is as a kernel reads
        it; None when the request-by-request path must run (also when a subclass changes how partials are laid
        out)."""
        cls = type(self)
        if any(getattr(cls, m) is not getattr(ReferenceTarget, m) for m in _KERNEL_METHODS):
            return None
        page, max_chunks = self.capacity.template.page_size, -(-self.capacity.max_kv_len // self.chunk)
        if n < 0 or len(qo) <= n or len(kv) <= n or len(last) < n or qo[0] < 0 or kv[0] < 0:
            return None
        if qo[n] > q_rows or kv[n] > idx.numel():
            return None
        reqs = []
        for i in range(n):
            q0, q1, p0, p1 = qo[i], qo[i + 1], kv[i], kv[i + 1]
            if q1 < q0 or p1 < p0:
                return None
            if q1 == q0 or p1 == p0:
                continue
            if not 1 <= last[i] <= page:
                return None
            length = (p1 - p0 - 1) * page + last[i]
            if -(-length // self.chunk) > max_chunks:
                return None
            reqs.append((q0, q1, p0, p1, length))
        if reqs:
            used = idx[min(r[2] for r in reqs) : max(r[3] for r in reqs)]
            if int(used.min()) < 0 or int(used.max()) >= self.env.k_cache.shape[0]:
                return None
        return reqs

    def _batched(self, q: Any, idx: Any, reqs: list[tuple[int, int, int, int, int]], out: Any) -> None:
        """Every request of well-formed metadata at once, padded to the longest; the same partials written to
        and read back from the same workspace offsets as `_request`, and the same merge."""
        t, spec, chunk = self.torch, self.capacity.template, self.chunk
        page, heads, dv = spec.page_size, spec.num_qo_heads, spec.head_dim_vo
        max_chunks = -(-self.capacity.max_kv_len // chunk)
        a_n = len(reqs)
        l_max = max(q1 - q0 for q0, q1, _, _, _ in reqs)
        c_max = max(-(-s // chunk) for *_, s in reqs)
        p_max = max(p1 - p0 for _, _, p0, p1, _ in reqs)
        s_pad = c_max * chunk
        # pages (a request's own, then its first page as padding) and query rows, gathered at once
        pids = [idx[p0:p1].tolist() + [int(idx[p0])] * (p_max - (p1 - p0)) for _, _, p0, p1, _ in reqs]
        pid = t.tensor(pids, dtype=t.long, device=idx.device)
        kc, vc = self.env.k_cache, self.env.v_cache
        k = kc[pid].reshape(a_n, p_max * page, *kc.shape[2:]).float()
        v = vc[pid].reshape(a_n, p_max * page, *vc.shape[2:]).float()
        if p_max * page < s_pad:
            k = t.cat([k, k.new_zeros((a_n, s_pad - p_max * page, *k.shape[2:]))], 1)
            v = t.cat([v, v.new_zeros((a_n, s_pad - p_max * page, *v.shape[2:]))], 1)
        k, v = k[:, :s_pad], v[:, :s_pad]
        s_len = t.tensor([s for *_, s in reqs])
        key = t.arange(s_pad)
        inside = key[None, :] < s_len[:, None]  # [a, s]: keys past a request's length are zeroed, as padding is
        k = k.masked_fill(~inside[:, :, None, None], 0.0)
        v = v.masked_fill(~inside[:, :, None, None], 0.0)
        g = heads // k.shape[2]
        k, v = k.repeat_interleave(g, 2), v.repeat_interleave(g, 2)
        rows = t.tensor([r for q0, q1, *_ in reqs for r in range(q0, q0 + l_max)]).clamp(max=q.shape[0] - 1)
        qq = q[rows].float().reshape(a_n, l_max, heads, -1)
        logits = t.einsum("alhd,ashd->ahls", qq, k) * spec.scale
        if spec.logits_soft_cap > 0:
            logits = spec.logits_soft_cap * t.tanh(logits / spec.logits_soft_cap)
        q_len = t.tensor([q1 - q0 for q0, q1, *_ in reqs])
        pos = (s_len - q_len)[:, None] + t.arange(l_max)[None, :]  # [a, l]
        vis = inside[:, None, :].expand(a_n, l_max, s_pad)
        if spec.causal:
            vis = vis & (key[None, None, :] <= pos[:, :, None])
        if spec.window_left >= 0:
            vis = vis & (key[None, None, :] >= pos[:, :, None] - spec.window_left)
        logits = logits.masked_fill(~vis[:, None], float("-inf")).reshape(a_n, heads, l_max, c_max, chunk)
        lse = t.logsumexp(logits, -1)  # [a, h, l, c]
        p = t.softmax(logits, -1).nan_to_num(0.0)
        o = t.einsum("ahlcs,acshd->alchd", p, v.reshape(a_n, c_max, chunk, heads, dv))
        # the partials each request writes (its rows, its chunks), at `partial_offset`, and read back from there
        per_row = heads * (dv + 1)
        sel = [
            (a, r, c) for a, (q0, q1, *_, s) in enumerate(reqs) for r in range(q1 - q0) for c in range(-(-s // chunk))
        ]
        ws = self.workspace.view(t.uint8)
        f32 = t.empty(0, dtype=t.float32, device=ws.device).set_(ws.untyped_storage())
        start = ws.storage_offset() // 4
        base = t.tensor([start + ((reqs[a][0] + r) * max_chunks + c) * per_row for a, r, c in sel])
        flat = (base[:, None] + t.arange(per_row)[None, :]).reshape(-1)
        data = t.cat([o, lse.permute(0, 2, 3, 1)[..., None]], -1).reshape(a_n, l_max, c_max, per_row)
        a_i, r_i, c_i = (t.tensor(x) for x in zip(*sel, strict=True))
        f32.index_put_((flat,), data[a_i, r_i, c_i].reshape(-1))
        read = f32[flat].reshape(-1, heads, dv + 1)
        o_all = t.zeros((a_n, l_max, c_max, heads, dv))
        lse_all = t.full((a_n, l_max, c_max, heads), float("-inf"))  # absent chunks weigh nothing in the merge
        o_all[a_i, r_i, c_i], lse_all[a_i, r_i, c_i] = read[..., :dv], read[..., dv]
        w = t.softmax(lse_all, dim=2).nan_to_num(0.0)  # [a, l, c, h]
        merged = (w[..., None] * o_all).sum(2)  # [a, l, h, dv]
        for a, (q0, q1, *_) in enumerate(reqs):
            out[q0:q1] = merged[a, : q1 - q0]

    def _request(self, q: Any, k: Any, v: Any, row0: int) -> Any:
        t, spec = self.torch, self.capacity.template
        g = spec.num_qo_heads // k.shape[1]
        k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
        length, s_len = q.shape[0], k.shape[0]
        heads, dv = spec.num_qo_heads, spec.head_dim_vo
        chunks = -(-s_len // self.chunk)
        max_chunks = -(-self.capacity.max_kv_len // self.chunk)
        # every chunk at once (a few large ops instead of a few per chunk): keys past the end pad the last chunk
        # and are masked out, so each chunk's partial is that of its own keys alone
        pad = chunks * self.chunk - s_len
        if pad:
            k = t.cat([k, k.new_zeros((pad, *k.shape[1:]))])
            v = t.cat([v, v.new_zeros((pad, *v.shape[1:]))])
        logits = t.einsum("lhd,shd->hls", q, k) * spec.scale
        if spec.logits_soft_cap > 0:
            logits = spec.logits_soft_cap * t.tanh(logits / spec.logits_soft_cap)
        key = t.arange(chunks * self.chunk)[None, :]
        pos = (s_len - length + t.arange(length))[:, None]
        vis = key < s_len
        if spec.causal:
            vis = vis & (key <= pos)
        if spec.window_left >= 0:
            vis = vis & (key >= pos - spec.window_left)
        logits = logits.masked_fill(~vis[None], float("-inf")).reshape(heads, length, chunks, self.chunk)
        lse = t.logsumexp(logits, -1)  # [h, l, chunks]
        p = t.softmax(logits, -1).nan_to_num(0.0)
        o = t.einsum("hlcs,cshd->lchd", p, v.reshape(chunks, self.chunk, heads, dv))
        self._write_partials(row0, chunks, max_chunks, o, lse.permute(1, 2, 0))
        o_all, lse_all = self._read_partials(row0, length, chunks, max_chunks, heads, dv)
        w = t.softmax(lse_all, dim=0).nan_to_num(0.0)  # [chunks, l, h]
        return (w[..., None] * o_all).sum(0)

    def partial_offset(self, row: int, chunk: int, max_chunks: int) -> int:
        """Element offset (fp32) of one row's chunk partial in the workspace."""
        spec = self.capacity.template
        return (row * max_chunks + chunk) * spec.num_qo_heads * (spec.head_dim_vo + 1)

    def _write_partials(self, row0: int, chunks: int, max_chunks: int, o: Any, lse: Any) -> None:
        """Write rows ``row0..`` of chunks ``0..chunks-1``: ``o`` is [rows, chunks, heads, dv], ``lse`` [rows, chunks,
        heads]."""
        t, spec = self.torch, self.capacity.template
        per_row = spec.num_qo_heads * (spec.head_dim_vo + 1)
        data = t.cat([o, lse[..., None]], -1).reshape(o.shape[0], chunks, per_row)
        # a strided view over the workspace storage, as a kernel addresses it: it can run past the end of the
        # workspace (into the arena's guard zone) when the offsets are wrong
        ws = self.workspace.view(t.uint8)
        base = ws.untyped_storage()
        f32 = t.empty(0, dtype=t.float32, device=ws.device).set_(base)
        start = ws.storage_offset() // 4 + self.partial_offset(row0, 0, max_chunks)
        view = f32.as_strided((o.shape[0], chunks, per_row), (max_chunks * per_row, per_row, 1), start)
        view.copy_(data)

    def _read_partials(self, row0: int, length: int, chunks: int, max_chunks: int, heads: int, dv: int) -> Any:
        t = self.torch
        per_row = heads * (dv + 1)
        ws = self.workspace.view(t.uint8)
        f32 = t.empty(0, dtype=t.float32, device=ws.device).set_(ws.untyped_storage())
        start = ws.storage_offset() // 4 + self.partial_offset(row0, 0, max_chunks)
        view = f32.as_strided((length, chunks, per_row), (max_chunks * per_row, per_row, 1), start)
        v = view.reshape(length, chunks, heads, dv + 1).permute(1, 0, 2, 3)
        return v[..., :dv], v[..., dv]
