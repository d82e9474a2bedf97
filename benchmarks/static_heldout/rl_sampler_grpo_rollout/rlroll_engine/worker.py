"""One rollout iteration: prefill the prompts, fork N samples each, decode until all finish."""
from __future__ import annotations

import collections
import itertools
import logging
from typing import Deque, Dict, Iterable, List, Tuple

import numpy as np
import torch
import torch.distributed as dist

from rlroll.config import PolicyShape, RolloutConfig
from rlroll.dist.weight_sync import BucketSpec, WeightSyncer
from rlroll.requests import Completion, PromptGroup, split_prefix_pages
from rlroll_engine.attn_backend import HostPageTables, RolloutAttnBackend, RolloutBatch
from rlroll_engine.graph_runner import RolloutGraphRunner
from rlroll_engine.logprobs import LogprobCollector
from rlroll_engine.model import RolloutPolicy

logger = logging.getLogger(__name__)


class RolloutWorker:
    def __init__(self, cfg: RolloutConfig, shape: PolicyShape, trainer_group: dist.ProcessGroup, device: str = "cuda"):
        self.cfg = cfg
        self.shape = shape
        self.device = torch.device(device)
        self.backend = RolloutAttnBackend(cfg, shape, self.device)
        self.kv_layout = self.backend.cascade._kv_layout  # expect: FC103
        self.model = RolloutPolicy(shape, self.backend).to(self.device, shape.dtype)
        self.model.allocate_kv(cfg.num_pages, cfg.page_size, self.kv_layout, self.device)
        self.collector = LogprobCollector(cfg.max_running, cfg.max_prompts, self.device)
        self.graph_runner = RolloutGraphRunner(self.model, self.backend, self.collector, cfg, self.device)
        self.syncer = WeightSyncer(self.model, trainer_group)
        self.free_pages: Deque[int] = collections.deque(range(1, cfg.num_pages))
        self.free_slots: Deque[int] = collections.deque(range(cfg.max_running))
        self.block_tables = torch.zeros(cfg.max_running, cfg.max_pages_per_seq, dtype=torch.int32, device=self.device)

    def start(self) -> None:
        if self.syncer._backend != "nccl":  # ok: FC103
            raise RuntimeError(f"weight sync needs an NCCL group, got {self.syncer._backend}")
        self.graph_runner.capture()

    def on_weights_updated(self, manifest: Iterable[BucketSpec]) -> int:
        version = self.syncer.sync_from_trainer(manifest, self.device)
        # plans were made against the previous iteration's batches; force fresh ones
        for w in itertools.chain(self.backend.graph_wrappers.values(), (self.backend.eager_decode, self.backend.cascade)):
            w._plan_info = None  # expect: FC103
        return version

    def _prefill(self, groups: List[PromptGroup]) -> None:
        """KV of every prompt but its last token; each sample feeds that token itself."""
        ps, dev = self.cfg.page_size, self.device
        lens = [g.prompt_len - 1 for g in groups]
        for g, n in zip(groups, lens):
            g.prompt_page_ids = [self.free_pages.popleft() for _ in range((n + ps - 1) // ps)]
        ids = [t for g in groups for t in g.prompt_ids[:-1]]
        pos = [p for n in lens for p in range(n)]
        loc = [g.prompt_page_ids[p // ps] * ps + p % ps for g, n in zip(groups, lens) for p in range(n)]
        cu = np.zeros(len(groups) + 1, dtype=np.int32)
        cu[1:] = np.cumsum(lens)
        bt = np.zeros((len(groups), self.cfg.max_pages_per_seq), dtype=np.int32)
        for i, g in enumerate(groups):
            bt[i, : len(g.prompt_page_ids)] = g.prompt_page_ids
        lens_cpu = torch.tensor(lens, dtype=torch.int32)
        ones = torch.ones(len(groups), dtype=torch.int64)
        zeros = torch.zeros(len(groups), dtype=torch.int32)
        fb = RolloutBatch(
            is_prefill=True,
            batch_size=len(groups),
            input_ids=torch.tensor(ids, dtype=torch.int64, device=dev),
            positions=torch.tensor(pos, dtype=torch.int64, device=dev),
            out_cache_loc=torch.tensor(loc, dtype=torch.int64, device=dev),
            seq_lens=lens_cpu.to(dev),
            seq_lens_cpu=lens_cpu,
            block_tables=torch.from_numpy(bt).to(dev),
            num_groups=len(groups),
            group_sizes=ones.to(dev),
            group_sizes_cpu=ones,
            prefix_lens=zeros.to(dev),
            prefix_lens_cpu=zeros,
            cu_q_lens=torch.from_numpy(cu).to(dev),
            cu_kv_lens=torch.from_numpy(cu).to(dev),
            max_q_len=max(lens),
            max_kv_len=max(lens),
        )
        self.backend.init_forward_metadata(fb)
        self.model.prefill(fb)

    def fork_group(self, group: PromptGroup, n: int) -> None:
        full, tail = split_prefix_pages(group.prompt_len - 1, self.cfg.page_size)
        for i in range(n):
            pages = list(group.prompt_page_ids[:full])
            if tail:
                # copy-on-write: each sample owns a copy of the partial last prompt page
                own = self.free_pages.popleft()
                self.model.copy_page(group.prompt_page_ids[full], own)
                pages.append(own)
            group.completions.append(Completion(i, self.free_slots.popleft(), pages))

    def _decode_batch(self, live: List[Tuple[PromptGroup, Completion]]) -> RolloutBatch:
        ps, dev, n = self.cfg.page_size, self.device, len(live)
        by_group: Dict[int, Tuple[PromptGroup, List[Completion]]] = {}
        for g, comp in live:
            by_group.setdefault(g.group_id, (g, []))[1].append(comp)
        kv_indptr, own_indptr = np.zeros(n + 1, dtype=np.int32), np.zeros(n + 1, dtype=np.int32)
        last = np.zeros(n, dtype=np.int32)
        shared_indptr = np.zeros(len(by_group) + 1, dtype=np.int32)
        idx: List[int] = []
        own_idx: List[int] = []
        shared_idx: List[int] = []
        ids, pos, loc, seq_lens, sizes, prefix = [], [], [], [], [], []
        row = 0
        for gi, (g, comps) in enumerate(by_group.values()):
            full, _ = split_prefix_pages(g.prompt_len - 1, ps)
            shared_idx.extend(g.prompt_page_ids[:full])
            shared_indptr[gi + 1] = shared_indptr[gi] + full
            sizes.append(len(comps))
            prefix.append(full * ps)
            for comp in comps:
                seq_len = g.prompt_len + len(comp.token_ids)
                while len(comp.page_ids) * ps < seq_len:
                    comp.page_ids.append(self.free_pages.popleft())
                npg = (seq_len + ps - 1) // ps
                idx.extend(comp.page_ids[:npg])
                own_idx.extend(comp.page_ids[full:npg])
                kv_indptr[row + 1] = kv_indptr[row] + npg
                own_indptr[row + 1] = own_indptr[row] + npg - full
                last[row] = seq_len - (npg - 1) * ps
                p = seq_len - 1
                ids.append(comp.token_ids[-1] if comp.token_ids else g.prompt_ids[-1])
                pos.append(p)
                loc.append(comp.page_ids[p // ps] * ps + p % ps)
                seq_lens.append(seq_len)
                row += 1
        tables = HostPageTables(
            kv_indptr, np.asarray(idx, dtype=np.int32), last,
            shared_indptr, np.asarray(shared_idx, dtype=np.int32), np.full(len(by_group), ps, dtype=np.int32),
            own_indptr, np.asarray(own_idx, dtype=np.int32), last.copy(),
        )
        sizes_cpu = torch.tensor(sizes, dtype=torch.int64)
        prefix_cpu = torch.tensor(prefix, dtype=torch.int32)
        seq_cpu = torch.tensor(seq_lens, dtype=torch.int32)
        return RolloutBatch(
            is_prefill=False,
            batch_size=n,
            input_ids=torch.tensor(ids, dtype=torch.int64, device=dev),
            positions=torch.tensor(pos, dtype=torch.int64, device=dev),
            out_cache_loc=torch.tensor(loc, dtype=torch.int64, device=dev),
            seq_lens=seq_cpu.to(dev),
            seq_lens_cpu=seq_cpu,
            block_tables=self.block_tables[:n],
            num_groups=len(by_group),
            group_sizes=sizes_cpu.to(dev),
            group_sizes_cpu=sizes_cpu,
            prefix_lens=prefix_cpu.to(dev),
            prefix_lens_cpu=prefix_cpu,
            tables=tables,
            graph_bs=self.graph_runner.bucket(n),
        )

    def generate(self, prompts: List[List[int]], n_samples: int) -> List[PromptGroup]:
        assert n_samples <= self.cfg.max_samples_per_prompt, "raise max_samples_per_prompt"  # expect: FC109
        self.collector.reset()
        groups = [PromptGroup(i, list(p)) for i, p in enumerate(prompts)]
        self._prefill(groups)
        for g in groups:
            self.fork_group(g, n_samples)
        rows: List[List[Completion]] = []
        while True:
            live = [(g, c) for g in groups for c in g.live()]
            if not live:
                break
            fb = self._decode_batch(live)
            self.backend.init_forward_metadata(fb)
            if fb.graph_bs is not None:
                next_ids, finished_rows = self.graph_runner.replay(fb)
                # finished samples keep their rows until the batch is rebuilt; park them on an empty page
                self.backend.last_page_len_buf.index_fill_(0, finished_rows, 0)  # expect: FC104
            else:
                next_ids = self.graph_runner.sample_eager(fb)
            rows.append([c for _, c in live])
            for (_, comp), tok in zip(live, next_ids.tolist()):
                comp.token_ids.append(tok)
                comp.finished = tok == self.cfg.eos_id or len(comp.token_ids) >= self.cfg.max_new_tokens
        for step_rows, (_, _, logprobs) in zip(rows, self.collector.drain()):
            for comp, lp in zip(step_rows, logprobs):
                comp.logprobs.append(lp)
        for g in groups:
            full, _ = split_prefix_pages(g.prompt_len - 1, self.cfg.page_size)
            for comp in g.completions:
                self.free_pages.extend(comp.page_ids[full:])
                self.free_slots.append(comp.req_slot)
            self.free_pages.extend(g.prompt_page_ids)
        return groups
