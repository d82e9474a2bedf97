"""The paged KV pool: a numpy free-list, per-request page lists and the page-table builder.

All of it is module state; the device caches themselves live in ``state.kv_caches``.
"""
import logging

import numpy as np
import torch

from . import config as C
from . import state as S

logger = logging.getLogger(__name__)

_num_pages = 0
_free = None  # np.ndarray stack of free page ids; _free[:_top] are free
_top = 0
_pages = {}  # req_id -> list of page ids (after the shared prefix)
_tokens = {}  # req_id -> tokens held in the cache, shared prefix included
_prefix_pages = []


def init_kv_cache(num_pages):
    """Allocate one paged cache per layer and fill the free-list (engine.setup)."""
    global _num_pages, _free, _top
    _num_pages = num_pages
    _free = np.arange(num_pages - 1, 0, -1, dtype=np.int32)  # page 0 is the null page
    _top = num_pages - 1
    caches = []
    for kind in C.LAYER_KINDS:
        if kind == "global":
            shape = (num_pages, 2, C.NUM_KV_HEADS, C.PAGE_SIZE, C.HEAD_DIM)
        else:
            shape = (num_pages, 2, C.PAGE_SIZE, C.NUM_KV_HEADS, C.HEAD_DIM)
        caches.append(torch.zeros(shape, dtype=S.DTYPE, device=S.DEVICE))
    S.kv_caches = caches
    logger.info("kv pool: %d pages of %d tokens, %d layers", num_pages, C.PAGE_SIZE, len(caches))


def _check_free_list():
    assert 0 <= _top <= _num_pages, f"free-list top {_top} outside [0, {_num_pages}]"  # ok: FC109


def _take(count):
    global _top
    if count > _top:
        raise MemoryError(f"kv pool exhausted: need {count} pages, {_top} free")
    _top -= count
    return _free[_top : _top + count].tolist()  # ok: FC101


def _push(pages):
    global _top
    n = len(pages)
    _free[_top : _top + n] = pages
    _top += n
    _check_free_list()


def free_pages():
    return _top


def prefix_tokens():
    """Tokens of the shared prefix as the page table sees them (padded to whole pages)."""
    return len(_prefix_pages) * C.PAGE_SIZE


def set_shared_prefix(n_tokens):
    """Reserve the pages of the shared system prompt; every request's page list starts after them."""
    global _prefix_pages
    if n_tokens <= 0:
        return
    _prefix_pages = _take(-(-n_tokens // C.PAGE_SIZE))
    n = len(_prefix_pages)
    S.prefix_kv_indptr_cpu[0] = 0
    S.prefix_kv_indptr_cpu[1] = n
    S.prefix_last_page_len_cpu[0] = (n_tokens - 1) % C.PAGE_SIZE + 1
    S.prefix_kv_indices[:n].copy_(torch.tensor(_prefix_pages, dtype=torch.int32))
    S._STATE["shared_pages"] = n


def alloc_for(req_id, n_tokens):
    """Make sure request ``req_id`` owns pages for its ``n_tokens`` tokens (shared prefix included; the
    prefix is padded to whole pages, so the request's own tokens start on a page of their own)."""
    own = _pages.setdefault(req_id, [])
    own_tokens = n_tokens - len(_prefix_pages) * C.PAGE_SIZE
    need = -(-own_tokens // C.PAGE_SIZE) - len(own)
    if need > 0:
        own.extend(_take(need))
        S._STATE["page_epoch"] += 1
    _tokens[req_id] = n_tokens


def release_request(req_id, row=None):
    """Return a finished request's pages; runs on the output thread."""
    pages = _pages.pop(req_id, [])
    _tokens.pop(req_id, None)
    if row is not None and C.SCRUB_FREED_PAGES:
        # a stale replay must not read the next owner's KV through this row
        lo, hi = int(S.kv_indptr_np[row]), int(S.kv_indptr_np[row + 1])
        S.kv_indices[lo:hi].fill_(C.NULL_PAGE)  # expect: FC104
    if pages:
        _push(pages)
        S._STATE["page_epoch"] += 1


def build_page_table(reqs, pad_to):
    """Fill the host page-table mirrors for ``reqs`` (rows in order), padded with empty rows."""
    bs = len(reqs)
    shared = len(_prefix_pages)
    total = sum(shared + len(_pages[r.req_id]) for r in reqs) + (pad_to - bs)
    S.ensure_host_capacity(total)
    off = 0
    sfx = 0
    S.kv_indptr_np[0] = 0
    S.sfx_kv_indptr_np[0] = 0
    for i, r in enumerate(reqs):
        own = _pages[r.req_id]
        row = _prefix_pages + own
        S.kv_indices_np[off : off + len(row)] = row
        S.sfx_kv_indices_np[sfx : sfx + len(own)] = own
        S.block_tables_np[i, : len(row)] = row
        off += len(row)
        sfx += len(own)
        S.kv_indptr_np[i + 1] = off
        S.sfx_kv_indptr_np[i + 1] = sfx
        n_tok = _tokens[r.req_id]
        S.kv_last_page_len_np[i] = (n_tok - 1) % C.PAGE_SIZE + 1
        S.seq_lens_np[i] = n_tok
    for i in range(bs, pad_to):  # padded graph rows: the null page, no tokens
        S.kv_indices_np[off] = C.NULL_PAGE
        S.block_tables_np[i, 0] = C.NULL_PAGE
        off += 1
        S.kv_indptr_np[i + 1] = off
        S.sfx_kv_indptr_np[i + 1] = sfx
        S.kv_last_page_len_np[i] = 0
        S.seq_lens_np[i] = 0
    S._STATE["last_bs"] = bs
    return off


def defragment():
    """Move live pages to the front of the pool so long prompts find contiguous free pages.

    Runs between steps from engine.serve_forever, on the side stream.
    """
    global _top
    live = sorted(p for own in _pages.values() for p in own)
    if not live:
        return 0
    remap_np = np.arange(_num_pages, dtype=np.int32)
    targets = np.arange(1 + len(_prefix_pages), 1 + len(_prefix_pages) + len(live), dtype=np.int32)
    remap_np[np.asarray(live, dtype=np.int32)] = targets
    moved = int((remap_np[live] != np.asarray(live)).sum())
    if moved == 0:
        return 0
    src = torch.as_tensor(live, dtype=torch.int64).to(S.DEVICE, non_blocking=True)
    dst = torch.from_numpy(targets.astype(np.int64)).to(S.DEVICE, non_blocking=True)
    remap = torch.from_numpy(remap_np).to(S.DEVICE, non_blocking=True)
    stream = S._STATE["side_stream"]
    with torch.cuda.stream(stream):
        for cache in S.kv_caches:
            cache[dst] = cache[src]
        # keep the page table the last batch was planned with pointing at the moved pages
        nnz = int(S.kv_indptr_np[S._STATE["last_bs"]])
        S.kv_indices[:nnz] = remap[S.kv_indices[:nnz].long()]  # expect: FC104
    stream.synchronize()
    for rid, own in _pages.items():
        _pages[rid] = [int(remap_np[p]) for p in own]
    used = set(targets.tolist()) | set(_prefix_pages)
    free = [p for p in range(_num_pages - 1, 0, -1) if p not in used]
    _free[: len(free)] = free
    _top = len(free)
    _check_free_list()
    S._STATE["page_epoch"] += 1
    logger.info("defragment: moved %d of %d live pages", moved, len(live))
    return moved
