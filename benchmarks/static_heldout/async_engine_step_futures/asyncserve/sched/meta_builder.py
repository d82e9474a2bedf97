"""Step metadata, built on the metadata thread while the GPU runs the previous step.

Everything here writes pinned buffers through their numpy views; the worker uploads them with
non_blocking copies. Two buffer sets alternate so a build never overwrites what an upload still reads.
"""

import bisect
from typing import Optional

import numpy as np
import torch

from asyncserve.config import AsyncEngineConfig
from asyncserve.protocol import HostStepMeta, ScheduledBatch, StepResult


class PinnedStepBuffers:
    def __init__(self, cfg: AsyncEngineConfig):
        t, b, p = cfg.max_num_tokens, cfg.max_batch_size, cfg.max_total_pages

        def pinned(n, dtype=torch.int32):
            return torch.zeros(n, dtype=dtype, pin_memory=True)

        self.input_ids = pinned(t, torch.long)
        self.positions = pinned(t, torch.long)
        self.seq_lens = pinned(b)
        self.extend_lens = pinned(b)
        self.prev_rows = pinned(b, torch.long)
        self.kv_indptr = pinned(b + 1)
        self.kv_indices = pinned(p)
        self.last_page = pinned(b)
        self.qo_indptr = pinned(b + 1)
        self.chunk_indptr = pinned(b + 1)
        self.chunk_indices = pinned(p)
        self.chunk_last_page = pinned(b)
        self.append_slots = pinned(b, torch.long)
        self.append_pages = pinned(b)
        self.write_pages = pinned(t, torch.long)
        self.write_offsets = pinned(t, torch.long)


class HostMetaBuilder:
    def __init__(self, cfg: AsyncEngineConfig):
        self.cfg = cfg
        self._bufs = [PinnedStepBuffers(cfg), PinnedStepBuffers(cfg)]
        self._graph_sizes = sorted(cfg.graph_batch_sizes)
        self._last_rows = {}

    def _graph_bs(self, bs: int) -> Optional[int]:
        i = bisect.bisect_left(self._graph_sizes, bs)
        return self._graph_sizes[i] if i < len(self._graph_sizes) else None

    def build(self, sched: ScheduledBatch, prev: Optional[StepResult]) -> HostStepMeta:
        cfg = self.cfg
        ps = cfg.page_size
        reqs = sched.reqs
        if prev is not None and sched.is_decode:
            # drop rows whose previous token was EOS: no point building metadata for them
            last = prev.next_tokens.tolist()  # expect: FC101
            ended = {rid for rid, tok in zip(prev.req_ids, last) if tok == cfg.eos_token_id}
            reqs = [r for r in reqs if r.rid not in ended]
        buf = self._bufs[sched.step_id % 2]
        bs = len(reqs)
        is_decode = sched.is_decode

        lens_np = np.array([r.seq_len + (1 if is_decode else 0) for r in reqs], dtype=np.int32)
        ext_np = np.array([1 if is_decode else r.seq_len - r.computed for r in reqs], dtype=np.int32)
        max_len = int(lens_np.max()) if bs else 0  # ok: FC101
        graph_bs = self._graph_bs(bs) if is_decode else None
        rows = graph_bs or bs

        seq_lens = buf.seq_lens.numpy()
        seq_lens[:bs] = lens_np
        seq_lens[bs:rows] = 1
        buf.extend_lens.numpy()[:bs] = ext_np

        # paged KV table, padded rows get one page each
        pages_np = (seq_lens[:rows] + ps - 1) // ps
        indptr = buf.kv_indptr.numpy()
        indptr[0] = 0
        np.cumsum(pages_np, out=indptr[1 : rows + 1])
        table = [np.asarray(r.page_ids[: pages_np[i]], dtype=np.int32) for i, r in enumerate(reqs)]
        table += [np.zeros(1, dtype=np.int32)] * (rows - bs)
        flat = np.concatenate(table) if table else np.zeros(0, dtype=np.int32)
        buf.kv_indices.numpy()[: flat.shape[0]] = flat
        buf.last_page.numpy()[:rows] = seq_lens[:rows] - (pages_np - 1) * ps

        # chunked local attention: only the pages of each request's current attention chunk
        chunk_first = ((seq_lens[:rows] - 1) // cfg.attn_chunk) * cfg.attn_chunk // ps
        chunk_pages = pages_np - chunk_first
        cindptr = buf.chunk_indptr.numpy()
        cindptr[0] = 0
        np.cumsum(chunk_pages, out=cindptr[1 : rows + 1])
        cflat = np.concatenate([t[f:] for t, f in zip(table, chunk_first)]) if table else flat
        buf.chunk_indices.numpy()[: cflat.shape[0]] = cflat
        buf.chunk_last_page.numpy()[:rows] = buf.last_page.numpy()[:rows]

        # pages that became live this step go into the device table right after the step
        fresh = [i for i in range(bs) if (lens_np[i] - 1) % ps == 0 and is_decode]
        buf.append_slots.numpy()[: len(fresh)] = [indptr[i + 1] - 1 for i in fresh]
        buf.append_pages.numpy()[: len(fresh)] = [reqs[i].page_ids[pages_np[i] - 1] for i in fresh]

        # token inputs (prefill) or the row map into the previous step's device tokens (decode)
        qo = buf.qo_indptr.numpy()
        qo[0] = 0
        np.cumsum(ext_np, out=qo[1 : bs + 1])
        qo[bs + 1 : rows + 1] = qo[bs]
        num_tokens = int(qo[bs])
        pos = np.concatenate([np.arange(l - e, l) for l, e in zip(lens_np, ext_np)]) if bs else np.zeros(0, np.int64)
        buf.positions.numpy()[:num_tokens] = pos
        buf.write_pages.numpy()[:num_tokens] = [
            reqs[i].page_ids[p // ps] for i in range(bs) for p in range(lens_np[i] - ext_np[i], lens_np[i])
        ]
        buf.write_offsets.numpy()[:num_tokens] = pos % ps
        if is_decode:
            buf.prev_rows.numpy()[:bs] = [self._last_rows.get(r.rid, 0) for r in reqs]
        else:
            ids = np.concatenate([np.asarray(r.prompt[r.computed :], dtype=np.int64) for r in reqs])
            buf.input_ids.numpy()[:num_tokens] = ids
        self._last_rows = {r.rid: i for i, r in enumerate(reqs)}

        return HostStepMeta(
            step_id=sched.step_id,
            req_ids=[r.rid for r in reqs],
            bs=bs,
            rows=rows,
            is_decode=is_decode,
            num_tokens=num_tokens,
            graph_bs=graph_bs,
            max_seq_len=max_len,
            use_trtllm=cfg.use_trtllm_long and max_len >= cfg.long_context_threshold,
            input_ids_pinned=buf.input_ids,
            positions_pinned=buf.positions,
            seq_lens_pinned=buf.seq_lens,
            extend_lens_pinned=buf.extend_lens,
            prev_rows_pinned=buf.prev_rows,
            kv_indptr_pinned=buf.kv_indptr,
            kv_indices_pinned=buf.kv_indices[: int(indptr[rows])],
            last_page_pinned=buf.last_page,
            qo_indptr_pinned=buf.qo_indptr,
            chunk_indptr_pinned=buf.chunk_indptr,
            chunk_indices_pinned=buf.chunk_indices[: int(cindptr[rows])],
            chunk_last_page_pinned=buf.chunk_last_page,
            append_slots_pinned=buf.append_slots[: len(fresh)],
            append_pages_pinned=buf.append_pages[: len(fresh)],
            write_pages_pinned=buf.write_pages,
            write_offsets_pinned=buf.write_offsets,
        )
