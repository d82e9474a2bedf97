"""Per-step state of the runtime, kept as module globals.

init_buffers() fills everything once; plan.py, graphs.py and engine.py then read and write the tensors
through ``from . import state as S``.  The captured decode graphs are bound to ``kv_indptr``,
``kv_indices`` and ``kv_last_page_len`` (see wrappers.make_graph_wrapper) and read ``input_ids``,
``positions``, ``seq_lens`` and ``block_tables`` by address.
"""
import logging

import torch

logger = logging.getLogger(__name__)

DEVICE = torch.device("cuda")
DTYPE = torch.bfloat16

max_bs = 0
max_pages = 0
max_tokens = 0
max_pages_per_seq = 0

# device page table (graph-bound)
kv_indptr = None
kv_indices = None
kv_last_page_len = None

# other device inputs
input_ids = None
positions = None
seq_lens = None
batch_indices = None
qo_indptr = None
cu_seq_lens = None
block_tables = None
swa_kv_indptr = None
swa_kv_indices = None
sfx_kv_indices = None
prefix_kv_indices = None
kv_caches = []

# pinned host mirrors and their numpy views
kv_indptr_cpu = None
kv_indices_cpu = None
kv_last_page_len_cpu = None
seq_lens_cpu = None
qo_indptr_cpu = None
positions_cpu = None
input_ids_cpu = None
batch_indices_cpu = None
block_tables_cpu = None
sfx_kv_indptr_cpu = None
sfx_kv_indices_cpu = None
prefix_kv_indptr_cpu = None
prefix_last_page_len_cpu = None

kv_indptr_np = None
kv_indices_np = None
kv_last_page_len_np = None
seq_lens_np = None
qo_indptr_np = None
positions_np = None
input_ids_np = None
batch_indices_np = None
block_tables_np = None
sfx_kv_indptr_np = None
sfx_kv_indices_np = None

# everything that is not a plain tensor global
_STATE = {
    "step": 0,
    "page_epoch": 0,
    "use_cascade": False,
    "max_seq_len": 1,
    "max_q_len": 1,
    "shared_pages": 0,
    "last_bs": 0,
    "plan_key": {},
}


def _pinned(*shape, dtype=torch.int32):
    return torch.zeros(*shape, dtype=dtype, pin_memory=True)


def init_buffers(max_batch_size, max_num_pages, max_num_tokens):
    """Allocate every per-step tensor for the largest batch (called once from engine.setup)."""
    global max_bs, max_pages, max_tokens, max_pages_per_seq
    global kv_indptr, kv_indices, kv_last_page_len
    global input_ids, positions, seq_lens, batch_indices, qo_indptr, cu_seq_lens, block_tables
    global swa_kv_indptr, swa_kv_indices, sfx_kv_indices, prefix_kv_indices
    global kv_indptr_cpu, kv_indices_cpu, kv_last_page_len_cpu, seq_lens_cpu, qo_indptr_cpu
    global positions_cpu, input_ids_cpu, batch_indices_cpu, block_tables_cpu
    global sfx_kv_indptr_cpu, sfx_kv_indices_cpu, prefix_kv_indptr_cpu, prefix_last_page_len_cpu
    global kv_indptr_np, kv_indices_np, kv_last_page_len_np, seq_lens_np, qo_indptr_np
    global positions_np, input_ids_np, batch_indices_np, block_tables_np, sfx_kv_indptr_np, sfx_kv_indices_np
    assert max_batch_size <= max_num_pages, "the pool needs at least one page per running sequence"  # expect: FC109

    max_bs = max_batch_size
    max_pages = max_num_pages
    max_tokens = max(max_num_tokens, max_batch_size)
    max_pages_per_seq = max_num_pages

    kv_indptr = torch.zeros(max_bs + 2, dtype=torch.int32, device=DEVICE)
    kv_indices = torch.zeros(max_pages, dtype=torch.int32, device=DEVICE)
    kv_last_page_len = torch.ones(max_bs + 1, dtype=torch.int32, device=DEVICE)

    input_ids = torch.zeros(max_tokens, dtype=torch.int64, device=DEVICE)
    positions = torch.zeros(max_tokens, dtype=torch.int64, device=DEVICE)
    seq_lens = torch.zeros(max_bs + 1, dtype=torch.int32, device=DEVICE)
    batch_indices = torch.zeros(max_tokens, dtype=torch.int32, device=DEVICE)
    qo_indptr = torch.zeros(max_bs + 2, dtype=torch.int32, device=DEVICE)
    cu_seq_lens = torch.zeros(max_bs + 2, dtype=torch.int32, device=DEVICE)
    block_tables = torch.zeros(max_bs, max_pages_per_seq, dtype=torch.int32, device=DEVICE)
    swa_kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=DEVICE)
    swa_kv_indices = torch.zeros(max_pages, dtype=torch.int32, device=DEVICE)
    sfx_kv_indices = torch.zeros(max_pages, dtype=torch.int32, device=DEVICE)
    prefix_kv_indices = torch.zeros(max_pages, dtype=torch.int32, device=DEVICE)

    kv_indptr_cpu = _pinned(max_bs + 2)
    kv_indices_cpu = _pinned(max_pages)
    kv_last_page_len_cpu = _pinned(max_bs + 1)
    seq_lens_cpu = _pinned(max_bs + 1)
    qo_indptr_cpu = _pinned(max_bs + 2)
    positions_cpu = _pinned(max_tokens, dtype=torch.int64)
    input_ids_cpu = _pinned(max_tokens, dtype=torch.int64)
    batch_indices_cpu = _pinned(max_tokens)
    block_tables_cpu = _pinned(max_bs, max_pages_per_seq)
    sfx_kv_indptr_cpu = _pinned(max_bs + 1)
    sfx_kv_indices_cpu = _pinned(max_pages)
    prefix_kv_indptr_cpu = _pinned(2)
    prefix_last_page_len_cpu = _pinned(1)

    kv_indptr_np = kv_indptr_cpu.numpy()
    kv_indices_np = kv_indices_cpu.numpy()
    kv_last_page_len_np = kv_last_page_len_cpu.numpy()
    seq_lens_np = seq_lens_cpu.numpy()
    qo_indptr_np = qo_indptr_cpu.numpy()
    positions_np = positions_cpu.numpy()
    input_ids_np = input_ids_cpu.numpy()
    batch_indices_np = batch_indices_cpu.numpy()
    block_tables_np = block_tables_cpu.numpy()
    sfx_kv_indptr_np = sfx_kv_indptr_cpu.numpy()
    sfx_kv_indices_np = sfx_kv_indices_cpu.numpy()

    # sampling parameters: one device block with per-row views, filled from a pinned twin every step
    _STATE["sampling"] = torch.ones(2, max_bs + 1, dtype=torch.float32, device=DEVICE)
    _STATE["sampling_cpu"] = _pinned(2, max_bs + 1, dtype=torch.float32)
    _STATE["temperature"] = _STATE["sampling"][0]
    _STATE["logit_scale"] = _STATE["sampling"][1]
    _STATE["ignore_eos"] = torch.zeros(max_bs + 1, dtype=torch.bool, device=DEVICE)
    _STATE["ignore_eos_cpu"] = _pinned(max_bs + 1, dtype=torch.bool)
    _STATE["max_len"] = torch.zeros(max_bs + 1, dtype=torch.int32, device=DEVICE)
    _STATE["max_len_cpu"] = _pinned(max_bs + 1)
    _STATE["next_tokens"] = torch.zeros(max_bs, dtype=torch.int64, device=DEVICE)  # by request slot
    _STATE["sampled"] = torch.zeros(max_bs + 1, dtype=torch.int64, device=DEVICE)  # by batch row
    _STATE["finished"] = torch.zeros(max_bs + 1, dtype=torch.bool, device=DEVICE)
    _STATE["tokens_host"] = _pinned(2, max_bs + 1, dtype=torch.int64)
    _STATE["finished_host"] = _pinned(2, max_bs + 1, dtype=torch.bool)
    _STATE["side_stream"] = torch.cuda.Stream(device=DEVICE)

    # the page table the decode graphs are bound to, by name (init_graph_state walks it)
    _STATE["graph_bufs"] = {
        "kv_indptr": kv_indptr,
        "kv_indices": kv_indices,
        "kv_last_page_len": kv_last_page_len,
    }

    # scratch of the trtllm-gen context kernel (gsrt_ops.trtllm_paths.context_prefill):
    # per-CTA semaphores for the multi-CTA reduction, sized by the token budget
    _STATE["ctx_ws"] = torch.empty(max_tokens * 4096, dtype=torch.uint8, device=DEVICE)  # expect: FC105

    logger.info(
        "state: max_bs=%d max_pages=%d max_tokens=%d (%.1f MiB of metadata)",
        max_bs, max_pages, max_tokens, _metadata_bytes() / 2**20,
    )


def init_graph_state():
    """Clear the graph-bound page table before the first capture."""
    for buf in _STATE["graph_bufs"].values():
        buf.zero_()  # ok: FC104
    _STATE["plan_key"].clear()


def _metadata_bytes():
    total = 0
    for t in (kv_indptr, kv_indices, kv_last_page_len, input_ids, positions, seq_lens, block_tables):
        total += t.numel() * t.element_size()
    return total


def _grow(cur, need):
    return max(need, cur + cur // 2)


def ensure_host_capacity(nnz):
    """Grow the pinned page-index mirror; called by kvpool.build_page_table before it fills it."""
    global kv_indices_cpu, kv_indices_np, sfx_kv_indices_cpu, sfx_kv_indices_np
    if nnz <= kv_indices_cpu.numel():
        return
    cap = _grow(kv_indices_cpu.numel(), nnz)
    old = kv_indices_cpu
    kv_indices_cpu = torch.zeros(cap, dtype=torch.int32, pin_memory=True)  # ok: FC107
    kv_indices_cpu[: old.numel()].copy_(old)
    kv_indices_np = kv_indices_cpu.numpy()
    sfx_kv_indices_cpu = _pinned(cap)
    sfx_kv_indices_np = sfx_kv_indices_cpu.numpy()


def ensure_device_capacity(nnz):
    """Grow the device page indices to hold ``nnz`` entries (called right before a plan)."""
    global kv_indices
    if nnz <= kv_indices.numel():
        return
    logger.warning("growing kv_indices from %d to %d entries", kv_indices.numel(), nnz)
    kv_indices = torch.zeros(_grow(kv_indices.numel(), nnz), dtype=torch.int32, device=DEVICE)  # expect: FC107


def describe():
    """One-line summary for the admin endpoint."""
    return (
        f"step={_STATE['step']} epoch={_STATE['page_epoch']} cascade={_STATE['use_cascade']} "
        f"max_bs={max_bs} pages={max_pages} indices_cap={kv_indices_cpu.numel()}"
    )
