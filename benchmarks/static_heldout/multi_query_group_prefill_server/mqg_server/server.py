"""Prefill-heavy server: each step packs a group of short prompts into chunks, streams the first token of
every prompt that finished, then runs one decode step for the rows already decoding."""
from collections import deque
from dataclasses import dataclass, field
from typing import Deque, List, Tuple

import numpy as np
import torch

from mqg import Chunk, ChunkPlanner, ServerConfig
from mqg_attn.backend import DecodeRows, RaggedPrefillBackend
from mqg_server.gather import OutputGatherer
from mqg_server.graphs import DecodeGraphs
from mqg_server.model import PrefillModel


@dataclass
class PromptGroup:
    request_ids: List[int]
    prompt_lens: torch.Tensor       # device
    prompt_lens_cpu: torch.Tensor
    done_cpu: torch.Tensor          # tokens already prefilled by earlier steps
    token_ids: List[np.ndarray]
    page_tables: List[np.ndarray]
    sample_groups: List[int]        # requests that sample continuations of one prompt share a group


@dataclass
class DecodeSeq:
    rid: int
    group: int
    prompt_pages: np.ndarray
    own_pages: List[int] = field(default_factory=list)
    seq_len: int = 0
    last_token: int = 0


class PrefillServer:
    def __init__(self, cfg: ServerConfig, device_index: int = 0):
        self.cfg = cfg
        dev = torch.device("cuda", device_index)
        self.device = dev
        self._kv_layout = cfg.kv_layout
        shape = (cfg.max_decode_batch * cfg.pages_per_request, 2, cfg.num_kv_heads, cfg.page_size, cfg.head_dim)
        self.kv_caches = [torch.zeros(shape, dtype=cfg.dtype, device=dev) for _ in range(cfg.num_layers)]
        self.backend = RaggedPrefillBackend(cfg, dev)
        self.model = PrefillModel(cfg, self.backend, self.kv_caches, dev)
        self.planner = ChunkPlanner(cfg.chunk_size, cfg.page_size, 8 * cfg.max_prefill_tokens, dev)
        self.graphs = DecodeGraphs(cfg, self.model, self.backend, dev)
        self.gatherer = OutputGatherer(cfg.max_prompts_per_step, dev)
        self.pending: Deque[PromptGroup] = deque()
        self.decoding: List[DecodeSeq] = []
        self._next_index_slot = 0
        self._next_rid = 0
        self._started = False

    def start(self) -> None:
        if self._kv_layout != "HND":  # ok: FC103
            raise ValueError("the trtllm-gen context kernel needs the HND layout")
        self.graphs.record_all()
        self._started = True

    def submit(self, prompts: List[List[int]], sample_groups: List[int], page_tables: List[np.ndarray]) -> List[int]:
        rids = list(range(self._next_rid, self._next_rid + len(prompts)))
        self._next_rid += len(prompts)
        lens_cpu = torch.tensor([len(p) for p in prompts], dtype=torch.int32)
        self.pending.append(PromptGroup(
            request_ids=rids,
            prompt_lens=lens_cpu.to(self.device, non_blocking=True),
            prompt_lens_cpu=lens_cpu,
            done_cpu=torch.zeros_like(lens_cpu),
            token_ids=[np.asarray(p, dtype=np.int64) for p in prompts],
            page_tables=page_tables,
            sample_groups=sample_groups,
        ))
        return rids

    def step(self) -> List[Tuple[int, int]]:
        assert self._started, "start() must run before step()"  # ok: FC109
        streamed: List[Tuple[int, int]] = []
        if self.pending:
            streamed += self._prefill_group(self.pending.popleft())
        if self.decoding:
            streamed += self._decode_step()
        return streamed

    # ---- prefill -----------------------------------------------------------------------------
    def _prefill_group(self, group: PromptGroup) -> List[Tuple[int, int]]:
        cfg, dev = self.cfg, self.device
        row_of = {rid: i for i, rid in enumerate(group.request_ids)}
        chunks = self.planner.split(group.prompt_lens, group.prompt_lens_cpu, group.done_cpu, group.page_tables, group.request_ids)
        streamed: List[Tuple[int, int]] = []
        for chunk in chunks:
            kernel = self.backend.plan_chunk(chunk)
            n_tok = chunk.num_tokens
            pieces = torch.arange(len(chunk.lens), device=dev)
            tok_piece = torch.repeat_interleave(pieces, chunk.q_lens, output_size=n_tok)  # ok: FC101
            pos = torch.arange(n_tok, device=dev) - chunk.qo_indptr[tok_piece] + chunk.starts_dev[tok_piece]
            page = chunk.block_table[tok_piece, pos // cfg.page_size].long()
            loc = page * cfg.page_size + pos % cfg.page_size
            ids_np = np.concatenate(
                [group.token_ids[row_of[r]][s : s + n] for r, s, n in zip(chunk.request_ids, chunk.starts, chunk.lens)]
            )
            ids = torch.from_numpy(ids_np).to(dev, non_blocking=True)
            hidden = self.model.forward_prefill(ids, loc, chunk, kernel)
            self.last_hidden = hidden.new_empty((len(chunk.lens), cfg.hidden_size))  # expect: FC107
            torch.index_select(hidden, 0, chunk.qo_indptr[1:] - 1, out=self.last_hidden)
            finished = torch.nonzero(chunk.is_last_cpu).flatten().tolist()  # ok: FC101
            if finished:
                logits = self.model.logits(self.last_hidden[finished])
                streamed += self.gatherer.gather(logits, [chunk.request_ids[i] for i in finished])
                for i in finished:
                    row = row_of[chunk.request_ids[i]]
                    self._admit_to_decode(chunk, i, group.page_tables[row], group.sample_groups[row])
        return streamed

    def _admit_to_decode(self, chunk: Chunk, i: int, prompt_pages: np.ndarray, sample_group: int) -> None:
        pages = chunk.block_table[i]
        start = self._next_index_slot
        # the new row's prompt pages go straight into the page list the decode graphs read
        self.backend.dec_indices[start : start + pages.numel()].copy_(pages)  # expect: FC104
        self._next_index_slot += pages.numel()
        seq_len = chunk.starts[i] + chunk.lens[i]
        self.decoding.append(DecodeSeq(chunk.request_ids[i], sample_group, prompt_pages, seq_len=seq_len))

    # ---- decode ------------------------------------------------------------------------------
    def _decode_rows(self) -> Tuple[DecodeRows, torch.Tensor, torch.Tensor]:
        dev, page = self.device, self.cfg.page_size
        seqs = self.decoding
        lens = np.array([s.seq_len + 1 for s in seqs], dtype=np.int32)
        own = [s.own_pages for s in seqs]
        indptr = np.zeros(len(seqs) + 1, dtype=np.int32)
        np.cumsum([len(p) for p in own], out=indptr[1:])
        groups = sorted({s.group for s in seqs})
        members = [sum(1 for s in seqs if s.group == g) for g in groups]
        firsts = [next(s for s in seqs if s.group == g) for g in groups]
        g_qo = np.zeros(len(groups) + 1, dtype=np.int32)
        np.cumsum(members, out=g_qo[1:])
        g_kv = np.zeros(len(groups) + 1, dtype=np.int32)
        np.cumsum([len(f.prompt_pages) for f in firsts], out=g_kv[1:])
        full = [np.concatenate([s.prompt_pages, np.asarray(s.own_pages, dtype=np.int32)]) for s in seqs]
        table = np.zeros((len(seqs), max(len(f) for f in full)), dtype=np.int32)
        for i, f in enumerate(full):
            table[i, : len(f)] = f
        last_slot = (lens - 1) % page
        loc_np = table[np.arange(len(seqs)), (lens - 1) // page].astype(np.int64) * page + last_slot
        rows = DecodeRows(
            kv_indptr_host=torch.from_numpy(indptr).pin_memory(),
            kv_indices=torch.from_numpy(np.concatenate([np.asarray(p, dtype=np.int32) for p in own])).to(dev),
            last_page_host=torch.from_numpy(last_slot + 1).to(torch.int32).pin_memory(),
            seq_lens=torch.from_numpy(lens).to(dev, non_blocking=True),
            block_table=torch.from_numpy(table).to(dev, non_blocking=True),
            group_qo_indptr_host=torch.from_numpy(g_qo),
            group_kv_indptr_host=torch.from_numpy(g_kv),
            group_indices=torch.from_numpy(np.concatenate([f.prompt_pages for f in firsts])).to(dev),
            group_last_page_host=torch.full((len(groups),), page, dtype=torch.int32),
            num_groups=sum(1 for m in members if m > 1),
            max_seq_len=int(lens.max()),
        )
        ids = torch.tensor([s.last_token for s in seqs], dtype=torch.int64).to(dev, non_blocking=True)
        return rows, ids, torch.from_numpy(loc_np).to(dev, non_blocking=True)

    def _decode_step(self) -> List[Tuple[int, int]]:
        rows, ids, loc = self._decode_rows()
        bs = rows.batch_size
        bucket = next((b for b in self.cfg.decode_buckets if b >= bs), None)
        if bucket is None:
            logits = self.model.forward_decode_eager(ids, loc, rows)
        else:
            logits = self.graphs.replay(rows, ids, loc, bucket)
        return self.gatherer.gather(logits, [s.rid for s in self.decoding])
