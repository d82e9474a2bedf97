"""The speculative worker: grow a budgeted draft tree, verify it, accept a path, roll back the rest."""
from __future__ import annotations

import logging
import queue
import threading
from dataclasses import dataclass, field
from typing import Dict, List, Tuple

import numpy as np
import torch

from spec_attn.draft_backend import DraftDecodeBackend, RootTable
from spec_attn.verify_backend import TreeBatch, VerifyBackend
from spec_run.draft_graphs import DraftGraphRunner, StepInputs
from spec_run.models import DraftModel, TargetModel
from treespec.budget import TokenBudget
from treespec.config import SpecConfig
from treespec.pages import PagePool
from treespec.tree import DraftTree, RootBatch, RowPageTable, build_tree_mask

logger = logging.getLogger(__name__)


@dataclass
class ReqState:
    req_id: int
    committed: int
    root_token: int
    draft_slots: List[int]
    max_new_tokens: int
    pending_leaf: int = -1  # accepted leaf whose draft KV was never written
    pending_leaf_slot: int = 0
    output: List[int] = field(default_factory=list)
    finished: bool = False


@dataclass
class StepResult:
    req_ids: List[int]
    paths: List[List[int]]  # accepted nodes (global ids), root first
    bonus: List[int]
    emitted: List[List[int]]
    offsets_np: np.ndarray
    node_slots_np: np.ndarray
    rejected_slots_np: np.ndarray
    rejected_pos_np: np.ndarray  # where the rejected slots sit in the draft page table


@dataclass
class StepContext:
    """Host-side facts of a step, kept until its device results land."""

    req_ids: List[int]
    tree: DraftTree
    last_indices_np: np.ndarray

    def resolve(self, accept_len: np.ndarray, best_node: np.ndarray, bonus: np.ndarray,
                emitted: np.ndarray) -> StepResult:
        paths, out, pos = [], [], 0
        for i in range(len(self.req_ids)):
            path = self.tree.path_np(int(best_node[i]))
            paths.append(path)
            out.append(emitted[pos: pos + int(accept_len[i])].tolist())
            pos += int(accept_len[i])
        keep = np.zeros(self.tree.num_nodes, dtype=bool)
        for p in paths:
            keep[p] = True
        rejected = self.tree.node_slots_np[~keep]
        rej_pos = np.flatnonzero(np.isin(self.last_indices_np, rejected))
        return StepResult(self.req_ids, paths, bonus.tolist(), out, self.tree.offsets_np,
                          self.tree.node_slots_np, rejected, rej_pos)


@dataclass
class OutputSlot:
    accept_len: torch.Tensor
    best_node: torch.Tensor
    bonus: torch.Tensor
    emitted: torch.Tensor
    event: torch.cuda.Event


class OutputStreamer:
    """Waits for each step's copies on its own thread and hands host results back to the worker."""

    def __init__(self, cfg: SpecConfig, depth: int = 2):
        pin = dict(dtype=torch.int64, pin_memory=True)
        self._free: "queue.Queue[OutputSlot]" = queue.Queue()
        for _ in range(depth):
            self._free.put(OutputSlot(torch.zeros(cfg.max_batch, **pin), torch.zeros(cfg.max_batch, **pin),
                                      torch.zeros(cfg.max_batch, **pin), torch.zeros(cfg.max_tree_nodes(), **pin),
                                      torch.cuda.Event()))
        self._work: "queue.Queue[Tuple[OutputSlot, StepContext, int]]" = queue.Queue()
        self._results: "queue.Queue[StepResult]" = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="spec-output", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def acquire(self) -> OutputSlot:
        return self._free.get()

    def submit(self, slot: OutputSlot, ctx: StepContext, num_emitted: int) -> None:
        self._work.put((slot, ctx, num_emitted))

    def take(self) -> StepResult:
        return self._results.get()

    def _loop(self) -> None:
        while True:
            slot, ctx, k = self._work.get()
            slot.event.synchronize()  # ok: FC101
            bs = len(ctx.req_ids)
            res = ctx.resolve(slot.accept_len[:bs].numpy(), slot.best_node[:bs].numpy(),
                              slot.bonus[:bs].numpy(), slot.emitted[:k].numpy())
            self._free.put(slot)
            self._results.put(res)


class DraftTreeBuilder:
    def __init__(self, cfg: SpecConfig, runner: DraftGraphRunner, backend: DraftDecodeBackend,
                 draft_pool: PagePool, device: torch.device):
        self.cfg = cfg
        self.runner = runner
        self.draft_pool = draft_pool
        self.device = device
        self.budget = TokenBudget(cfg.step_token_budget, cfg.max_nodes_per_request, cfg.min_nodes_per_request)
        # acceptance rate per batch row, updated on the device after every verify
        self.accept_ema = torch.full((cfg.max_batch,), 0.5, dtype=torch.float32, device=device)
        self._backend = backend
        self.last_table = RowPageTable.dummy(1)

    def grow(self, roots: RootBatch) -> DraftTree:
        cfg = self.cfg
        backend = self._backend  # ok: FC103
        shares = self.budget.split(self.accept_ema[: roots.bs], roots.bs)
        total = int(shares.sum())  # ok: FC101
        tree = DraftTree.from_budget(roots, shares, cfg.topk, cfg.max_depth, self.device)
        tree.cum_logp = torch.zeros(tree.num_nodes, dtype=torch.float32, device=self.device)  # ok: FC107
        tree.node_slots_np = np.asarray(self.draft_pool.alloc(tree.num_nodes), dtype=np.int64)

        inputs, table = self._root_inputs(roots, tree)
        self._expand(tree, 1, tree.offsets_np, self.runner.run_root(inputs, table))
        for depth in range(2, tree.max_depth + 1):
            frontier = tree.frontier_np(depth)
            table = tree.row_page_table(frontier, roots.draft_slots)
            if table.rows > backend.max_graph_rows:
                logger.debug("depth %d: %d rows exceed the captured buckets", depth, table.rows)
            logits = self.runner.run_step(self._row_inputs(tree, frontier, table), table)
            self._expand(tree, depth, frontier, logits)
            self.last_table = table
        logger.debug("grew %d draft nodes, %d of the budget unused", total, self.budget.unused(shares))
        return tree

    def _dev(self, arr: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(arr, dtype=np.int64)).to(self.device, non_blocking=True)

    def _root_inputs(self, roots: RootBatch, tree: DraftTree) -> Tuple[StepInputs, RootTable]:
        bs = roots.bs
        tokens = np.zeros(2 * bs, dtype=np.int64)
        positions = np.zeros(2 * bs, dtype=np.int64)
        slots = np.zeros(2 * bs, dtype=np.int64)
        ctx = []
        for i in range(bs):
            tokens[2 * i] = max(roots.pending_leaf_np[i], 0)
            tokens[2 * i + 1] = roots.root_tokens_np[i]
            positions[2 * i: 2 * i + 2] = roots.committed_np[i] - 1, roots.committed_np[i]
            slots[2 * i] = roots.pending_slot_np[i]
            slots[2 * i + 1] = tree.node_slots_np[tree.offsets_np[i]]
            ctx.append(np.concatenate([np.asarray(roots.draft_slots[i], dtype=np.int64), slots[2 * i: 2 * i + 2]]))
        kv_indptr = np.zeros(bs + 1, dtype=np.int32)
        np.cumsum([len(c) for c in ctx], out=kv_indptr[1:])
        table = RootTable(bs, np.arange(0, 2 * bs + 1, 2, dtype=np.int32), kv_indptr,
                          torch.from_numpy(np.concatenate(ctx).astype(np.int32)).to(self.device, non_blocking=True),
                          slots)
        return StepInputs(bs, self._dev(tokens), self._dev(positions), self._dev(slots)), table

    def _row_inputs(self, tree: DraftTree, frontier: np.ndarray, table: RowPageTable) -> StepInputs:
        req = tree.req_of_np(frontier)
        positions = tree.committed_np[req] + tree.depth_np[frontier]
        return StepInputs(table.rows, tree.tokens[self._dev(frontier)], self._dev(positions), self._dev(table.slots_np))

    def _expand(self, tree: DraftTree, depth: int, frontier: np.ndarray, logits: torch.Tensor) -> None:
        kids, rows, ranks = tree.children_np(depth, frontier)
        if kids.size == 0:
            return
        top_logp, top_tok = torch.log_softmax(logits.float(), dim=-1).topk(self.cfg.topk, dim=-1)
        kid_d, row_d, rank_d = self._dev(kids), self._dev(rows), self._dev(ranks)
        tree.tokens[kid_d] = top_tok[row_d, rank_d]
        tree.cum_logp[kid_d] = tree.cum_logp[self._dev(frontier[rows])] + top_logp[row_d, rank_d]


class TreeSpecWorker:
    def __init__(self, cfg: SpecConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.target_pages = PagePool(cfg.num_target_pages, cfg.page_size)
        self.draft_pool = PagePool(cfg.num_draft_slots, 1)
        self.draft_backend = DraftDecodeBackend(cfg, device)
        self.verify = VerifyBackend(cfg, device)
        self.draft_model = DraftModel(cfg, self.draft_backend, device).to(device)
        self.target = TargetModel(cfg, self.verify, device).to(device)
        self.runner = DraftGraphRunner(cfg, self.draft_model, self.draft_backend, device)
        self.builder = DraftTreeBuilder(cfg, self.runner, self.draft_backend, self.draft_pool, device)
        self.streamer = OutputStreamer(cfg)
        self.states: Dict[int, ReqState] = {}
        self._inflight = False

    def start(self) -> None:
        self.draft_backend.init_graph_wrappers(self.runner.buckets)
        self.runner.capture_draft_graphs()
        self.streamer.start()

    def step(self) -> int:
        if self._inflight:
            self._apply_results(self.streamer.take())
            self._inflight = False
        active = [s for s in self.states.values() if not s.finished]
        if not active:
            return 0
        roots = self._roots(active)
        tree = self.builder.grow(roots)
        tb = self._build_verify(tree, active)
        self.verify.plan_verify(tb)
        logits = self.target.verify(tb, tree.tokens)
        self._accept(tree, logits, [s.req_id for s in active])
        self._inflight = True
        return len(active)

    def _roots(self, active: List[ReqState]) -> RootBatch:
        return RootBatch(
            bs=len(active),
            req_ids=[s.req_id for s in active],
            root_tokens_np=np.array([s.root_token for s in active], dtype=np.int64),
            committed_np=np.array([s.committed for s in active], dtype=np.int64),
            draft_slots=[s.draft_slots for s in active],
            pending_leaf_np=np.array([s.pending_leaf for s in active], dtype=np.int64),
            pending_slot_np=np.array([s.pending_leaf_slot for s in active], dtype=np.int64),
        )

    def _build_verify(self, tree: DraftTree, active: List[ReqState]) -> TreeBatch:
        cfg, bs = self.cfg, tree.bs
        kv_lens = tree.committed_np + tree.sizes_np
        page_lists = [self.target_pages.ensure(s.req_id, int(n)) for s, n in zip(active, kv_lens)]
        n_pages = (kv_lens + cfg.page_size - 1) // cfg.page_size
        kv_indptr = np.zeros(bs + 1, dtype=np.int32)
        np.cumsum(n_pages, out=kv_indptr[1:])
        kv_indices = np.concatenate([np.asarray(p[:n], dtype=np.int32) for p, n in zip(page_lists, n_pages)])
        last = ((kv_lens - 1) % cfg.page_size + 1).astype(np.int32)

        # node j of request i is stored at token committed_i + j; its rope position is committed_i + depth
        tok_index = np.concatenate([c + np.arange(n) for c, n in zip(tree.committed_np, tree.sizes_np)])
        req = np.repeat(np.arange(bs), tree.sizes_np)
        pages = np.array([page_lists[r][t // cfg.page_size] for r, t in zip(req, tok_index)], dtype=np.int64)
        positions = tree.committed_np[req] + tree.depth_np

        qo_indptr = torch.zeros(bs + 1, dtype=torch.int32, device=self.device)
        torch.cumsum(tree.sizes_dev, 0, dtype=torch.int32, out=qo_indptr[1:])

        mask = build_tree_mask(tree)
        n_bits = mask.size
        self.verify.mask_pinned[:n_bits] = torch.from_numpy(mask)
        self.verify.mask_buf[:n_bits].copy_(self.verify.mask_pinned[:n_bits], non_blocking=True)  # ok: FC104
        to_dev = self.builder._dev
        return TreeBatch(
            bs=bs,
            num_nodes=tree.num_nodes,
            mask_len=n_bits,
            qo_indptr=qo_indptr,
            kv_indptr_cpu=torch.from_numpy(kv_indptr),
            kv_indices=torch.from_numpy(kv_indices).to(self.device, non_blocking=True),
            kv_last_page_len_cpu=torch.from_numpy(last),
            positions=to_dev(positions),
            slot_pages=to_dev(pages),
            slot_offsets=to_dev(tok_index % cfg.page_size),
        )

    def _accept(self, tree: DraftTree, logits: torch.Tensor, req_ids: List[int]) -> None:
        bs, n = tree.bs, tree.num_nodes
        pred = logits.argmax(dim=-1)
        acc = torch.zeros(n, dtype=torch.bool, device=self.device)
        acc[self.builder._dev(tree.offsets_np)] = True
        for d in range(1, tree.max_depth + 1):
            nodes = self.builder._dev(tree.level_np(d))
            par = tree.parents_dev[nodes]
            acc[nodes] = acc[par] & (tree.tokens[nodes] == pred[par])
        depth_acc = torch.where(acc, tree.depth_dev, torch.zeros_like(tree.depth_dev))  # ok: FC101
        key = depth_acc * n + torch.arange(n, device=self.device)
        best = torch.full((bs,), -1, dtype=torch.int64, device=self.device)
        best.scatter_reduce_(0, tree.req_of_node, key, reduce="amax")
        best_node, accept_len = best % n, best // n
        bonus = pred[best_node]
        drafted = acc & (tree.depth_dev > 0)
        emitted = tree.tokens[drafted]  # expect: FC101
        self.builder.accept_ema[:bs].mul_(0.8).add_(0.2 * accept_len.float() / max(tree.max_depth, 1))

        slot = self.streamer.acquire()
        k = emitted.shape[0]
        slot.accept_len[:bs].copy_(accept_len, non_blocking=True)
        slot.best_node[:bs].copy_(best_node, non_blocking=True)
        slot.bonus[:bs].copy_(bonus, non_blocking=True)
        slot.emitted[:k].copy_(emitted, non_blocking=True)
        slot.event.record()
        last = self.builder.last_table
        self.streamer.submit(slot, StepContext(req_ids, tree, last.indices_pinned.numpy()), k)

    def _apply_results(self, res: StepResult) -> None:
        """Commit accepted paths; return the pages and draft slots of rejected branches."""
        src_tok, dst_tok, owners = [], [], []
        for i, rid in enumerate(res.req_ids):
            st = self.states[rid]
            off = int(res.offsets_np[i])
            for j, node in enumerate(res.paths[i]):
                src_tok.append(st.committed + (node - off))
                dst_tok.append(st.committed + j)
                owners.append(rid)
        # move the accepted nodes' KV next to the prefix before the tail pages go back to the pool
        self._compact_target_kv(np.array(owners), np.array(src_tok), np.array(dst_tok))
        for i, rid in enumerate(res.req_ids):
            st = self.states[rid]
            path = res.paths[i]
            st.draft_slots.extend(int(s) for s in res.node_slots_np[path[:-1]])
            st.pending_leaf = res.emitted[i][-1] if res.emitted[i] else st.root_token
            st.pending_leaf_slot = int(res.node_slots_np[path[-1]])
            st.committed += len(path)
            st.output.extend(res.emitted[i] + [res.bonus[i]])
            st.root_token = res.bonus[i]
            st.finished = len(st.output) >= st.max_new_tokens
            self.target_pages.truncate(rid, st.committed)
        self.draft_pool.free(res.rejected_slots_np.tolist())
        if res.rejected_pos_np.size:
            pos = torch.from_numpy(res.rejected_pos_np).to(self.device, non_blocking=True)
            # the last replayed page table still names the freed slots: point them at the null slot
            self.draft_backend.graph_bufs["kv_indices"][pos] = 0  # expect: FC104

    def _compact_target_kv(self, owners: np.ndarray, src_tok: np.ndarray, dst_tok: np.ndarray) -> None:
        ps = self.cfg.page_size
        src_p = np.array([self.target_pages.pages_of(int(r))[t // ps] for r, t in zip(owners, src_tok)])
        dst_p = np.array([self.target_pages.pages_of(int(r))[t // ps] for r, t in zip(owners, dst_tok)])
        dev = self.builder._dev
        kv = self.target.kv_cache
        kv[:, dev(dst_p), :, :, dev(dst_tok % ps)] = kv[:, dev(src_p), :, :, dev(src_tok % ps)]
