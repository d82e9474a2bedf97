from dataclasses import dataclass, field
from typing import List

import numpy as np
import torch

from sdt import SpecConfig, TokenTree, TreeBatch, tree_position_ids
from sdt_attn.tree_backend import TreeAttnBackend
from sdt_engine.compact import KVCompactor
from sdt_engine.graphs import TreeGraphPool
from sdt_engine.model import TreeModel
from sdt_engine.verify import Verifier


@dataclass
class SpecRequest:
    rid: int
    tokens: List[int]
    pages: List[int] = field(default_factory=list)
    draft: List[int] = field(default_factory=list)


class SpecEngine:
    def __init__(self, cfg: SpecConfig, tree: TokenTree):
        self.cfg = cfg
        self.tree = tree
        dev = torch.device("cuda", torch.cuda.current_device())
        self.device = dev
        pages = cfg.max_batch_size * cfg.pages_per_request
        shape = (pages, cfg.page_size, cfg.num_kv_heads, cfg.head_dim)
        self.caches = [
            (torch.zeros(shape, dtype=cfg.dtype, device=dev), torch.zeros(shape, dtype=cfg.dtype, device=dev))
            for _ in range(cfg.num_layers + 1)
        ]
        self.backend = TreeAttnBackend(cfg, dev)
        self.backend.check_mask_bindings()
        self.model = TreeModel(cfg, self.backend, self.caches, dev)
        self.graphs = TreeGraphPool(cfg, self.model, self.backend, dev, list(cfg.tree_sizes))
        self.graphs.record_all()
        self.verifier = Verifier(tree, dev)
        self.compactor = KVCompactor(self.backend, self.caches[:-1], cfg.page_size, dev)

    def build_batch(self, reqs: List[SpecRequest]) -> TreeBatch:
        dev, page, n = self.device, self.cfg.page_size, self.tree.size
        lens = np.array([len(r.tokens) for r in reqs], dtype=np.int64)
        total = lens + n
        n_pages = (total + page - 1) // page
        indptr = np.zeros(len(reqs) + 1, dtype=np.int32)
        np.cumsum(n_pages, out=indptr[1:])
        indices = np.concatenate([np.asarray(r.pages[:p], dtype=np.int32) for r, p in zip(reqs, n_pages)])
        pos = tree_position_ids(self.tree, lens)
        node_tok = pos.reshape(len(reqs), n)
        loc = np.stack([np.asarray(r.pages, dtype=np.int64)[row // page] * page + row % page
                        for r, row in zip(reqs, node_tok)]).reshape(-1)
        drafts = np.array([r.draft for r in reqs], dtype=np.int64)
        return TreeBatch(
            seq_lens_np=lens,
            kv_indptr_host=torch.from_numpy(indptr).pin_memory(),
            kv_indices=torch.from_numpy(indices).to(dev, non_blocking=True),
            last_page_host=torch.from_numpy((total - 1) % page + 1).to(torch.int32).pin_memory(),
            qo_indptr_host=(torch.arange(len(reqs) + 1, dtype=torch.int32) * n).pin_memory(),
            qo_indptr_gpu=(torch.arange(len(reqs) + 1, dtype=torch.int32) * n).to(dev, non_blocking=True),
            seq_lens_dev=torch.from_numpy(lens).to(dev, non_blocking=True),
            draft_tokens=torch.from_numpy(drafts).to(dev, non_blocking=True),
            tree_positions=torch.from_numpy(pos).to(dev, non_blocking=True),
            out_loc=torch.from_numpy(loc).to(dev, non_blocking=True),
        )

    def step(self, reqs: List[SpecRequest]) -> List[List[int]]:
        batch = self.build_batch(reqs)
        bs, n = batch.batch_size, self.tree.size
        bucket = next((b for b in self.cfg.batch_buckets if b >= bs), None)
        key = (bucket, n) if bucket is not None else None
        if key is not None and self.graphs.enabled(key):
            logits, draft_logits = self.graphs.replay(batch, self.tree, key)
        else:
            self.backend.prepare_tree_metadata(batch, self.tree, None)
            logits, draft_logits = self.model.verify(
                batch.draft_tokens.view(-1), batch.tree_positions, batch.out_loc, None, n
            )
        res = self.verifier.accept(logits, batch)
        self.compactor.compact(batch, res)
        accepted = res.path_nodes.to("cpu").numpy()
        bonus = res.next_tokens.to("cpu").tolist()
        draft_root = torch.argmax(draft_logits, dim=-1).to("cpu").tolist()
        out = []
        for i, r in enumerate(reqs):
            new = [r.draft[j] for j in accepted[i, 1 : res.accept_lens_list[i]]] + [bonus[i]]
            r.tokens.extend(new)
            r.draft = [draft_root[i]] * n
            out.append(new)
        return out
