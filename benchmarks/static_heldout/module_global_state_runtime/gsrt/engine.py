"""The engine loop: request queues, the scheduler and step_once(), all module-level.

``serve_forever()`` calls ``step_once()`` back to back; an output thread turns the sampled tokens (copied to
pinned memory behind an event) into request outputs and releases finished requests.
"""
import argparse
import collections
import logging
import queue
import threading
import time

import numpy as np
import torch

from gsrt_ops import admin
from gsrt_ops import trtllm_paths as TR

from . import attn as A
from . import config as C
from . import graphs as G
from . import kvpool as K
from . import model as M
from . import plan as P
from . import sampler as SM
from . import state as S
from . import wrappers as W

logger = logging.getLogger("gsrt.engine")

_WAITING = collections.deque()
_RUNNING = []
_CHUNKING = None  # the long prompt being prefilled a chunk per decode step
_FREE_SLOTS = []
_LAST_ROWS = ()
_LOCK = threading.Lock()
_OUT_Q = queue.Queue()
_STOP = threading.Event()
_NEXT_ID = 0


class Request:
    __slots__ = (
        "req_id", "prompt", "tokens", "output", "max_new_tokens", "ignore_eos", "temperature",
        "logit_scale", "num_computed", "slot", "done",
    )

    def __init__(self, req_id, prompt, max_new_tokens, ignore_eos, temperature, logit_scale):
        self.req_id = req_id
        self.prompt = list(prompt)
        self.tokens = list(prompt)
        self.output = []
        self.max_new_tokens = max_new_tokens
        self.ignore_eos = ignore_eos
        self.temperature = temperature
        self.logit_scale = logit_scale
        self.num_computed = 0
        self.slot = -1
        self.done = threading.Event()


class Batch:
    """What one step runs (host data only; built by schedule() every step)."""

    def __init__(self, reqs, is_decode, ext=None, n_extend=0, ext_final=False):
        self.reqs = reqs
        self.is_decode = is_decode
        self.bs = len(reqs)
        self.ext = ext
        self.n_extend = n_extend
        self.ext_final = ext_final
        self.gbs = None
        self.reordered = True
        self.num_tokens = 0
        self.slots_np = None
        self.slots_gpu = None

    def rows(self):
        return self.reqs + ([self.ext] if self.ext is not None else [])

    def sampled_reqs(self):
        return self.reqs + ([self.ext] if self.ext_final else [])

    def q_len_of(self, req):
        if req is self.ext:
            return self.n_extend
        return 1 if self.is_decode else len(req.prompt)


def add_request(prompt_ids, max_new_tokens=128, ignore_eos=False, temperature=1.0, logit_scale=1.0):
    """Queue a request; returns it (wait on ``req.done``)."""
    global _NEXT_ID
    assert max_new_tokens > 0, "max_new_tokens must be positive"  # expect: FC109
    if len(prompt_ids) + max_new_tokens > C.MAX_MODEL_LEN:
        raise ValueError(f"prompt of {len(prompt_ids)} + {max_new_tokens} new tokens exceeds {C.MAX_MODEL_LEN}")
    with _LOCK:
        _NEXT_ID += 1
        req = Request(_NEXT_ID, prompt_ids, max_new_tokens, ignore_eos, temperature, logit_scale)
        _WAITING.append(req)
    return req


def _admit(req):
    req.slot = _FREE_SLOTS.pop()
    req.num_computed = K.prefix_tokens()


def _take_prefill():
    reqs, budget = [], C.MAX_NUM_TOKENS
    while _WAITING and len(reqs) + len(_RUNNING) < C.MAX_BS and _FREE_SLOTS:
        r = _WAITING[0]
        if len(r.prompt) > C.CHUNK_SIZE or len(r.prompt) > budget:
            break
        _WAITING.popleft()
        _admit(r)
        K.alloc_for(r.req_id, r.num_computed + len(r.prompt))
        budget -= len(r.prompt)
        reqs.append(r)
    return reqs


def schedule():
    """This step's batch: waiting prompts first (prefill), else the running requests (decode) with at
    most one chunk of a long prompt riding along."""
    global _CHUNKING, _LAST_ROWS
    with _LOCK:
        if _CHUNKING is None and _WAITING and len(_WAITING[0].prompt) > C.CHUNK_SIZE and _FREE_SLOTS:
            _CHUNKING = _WAITING.popleft()
            _admit(_CHUNKING)
        prefill = _take_prefill()
        if prefill:
            batch = Batch(prefill, is_decode=False)
        elif _RUNNING or _CHUNKING is not None:
            ext, n_ext, final = None, 0, False
            if _CHUNKING is not None:
                ext = _CHUNKING
                done = ext.num_computed - K.prefix_tokens()
                n_ext = min(C.CHUNK_SIZE, len(ext.prompt) - done)
                final = done + n_ext == len(ext.prompt)
                K.alloc_for(ext.req_id, ext.num_computed + n_ext)
            for r in _RUNNING:
                K.alloc_for(r.req_id, r.num_computed + 1)
            batch = Batch(list(_RUNNING), is_decode=True, ext=ext, n_extend=n_ext, ext_final=final)
        else:
            return None
    ids = tuple(r.req_id for r in batch.reqs)
    batch.reordered = not batch.is_decode or batch.ext is not None or ids != _LAST_ROWS
    _LAST_ROWS = ids if batch.is_decode else ()
    if batch.is_decode and batch.ext is None:
        batch.gbs = G.bucket_for(batch.bs)
    return batch


def _fill_host_metadata(batch):
    rows = batch.rows()
    pad_to = batch.gbs or len(rows)
    K.build_page_table(rows, pad_to)
    samp = S._STATE["sampling_cpu"].numpy()
    ign = S._STATE["ignore_eos_cpu"].numpy()
    max_len = S._STATE["max_len_cpu"].numpy()
    n, max_q = 0, 1
    S.qo_indptr_np[0] = 0
    for i, r in enumerate(rows):
        q_len = batch.q_len_of(r)
        start = r.num_computed
        if not batch.is_decode or r is batch.ext:
            first = start - K.prefix_tokens()
            S.input_ids_np[n : n + q_len] = r.tokens[first : first + q_len]
        S.positions_np[n : n + q_len] = np.arange(start, start + q_len)
        S.batch_indices_np[n : n + q_len] = i
        n += q_len
        max_q = max(max_q, q_len)
        S.qo_indptr_np[i + 1] = n
        samp[0, i] = r.temperature
        samp[1, i] = r.logit_scale
        ign[i] = r.ignore_eos
        max_len[i] = K.prefix_tokens() + len(r.prompt) + r.max_new_tokens
    for i in range(len(rows), pad_to):  # padded graph rows: one dummy token on the null page
        S.positions_np[n] = 0
        S.batch_indices_np[n] = i
        n += 1
        S.qo_indptr_np[i + 1] = n
    batch.num_tokens = n
    batch.slots_np = np.array([r.slot for r in batch.sampled_reqs()] + [0] * (pad_to - len(rows)), dtype=np.int64)
    S._STATE["max_q_len"] = max_q


def _upload_inputs(batch, validate=False):
    n = batch.num_tokens
    rows = batch.gbs or len(batch.rows())
    S.positions[:n].copy_(S.positions_cpu[:n], non_blocking=True)
    S.batch_indices[:n].copy_(S.batch_indices_cpu[:n], non_blocking=True)
    S.block_tables[:rows].copy_(S.block_tables_cpu[:rows], non_blocking=True)
    S._STATE["sampling"][:, :rows].copy_(S._STATE["sampling_cpu"][:, :rows], non_blocking=True)
    S._STATE["ignore_eos"][:rows].copy_(S._STATE["ignore_eos_cpu"][:rows], non_blocking=True)
    S._STATE["max_len"][:rows].copy_(S._STATE["max_len_cpu"][:rows], non_blocking=True)
    if batch.reordered:
        # the device seq_lens advance in post_step while the rows stay the same
        S.seq_lens[:rows].copy_(S.seq_lens_cpu[:rows], non_blocking=True)
        S._STATE["finished"][:rows].zero_()
    torch.cumsum(S.seq_lens[:rows], 0, dtype=torch.int32, out=S.cu_seq_lens[1 : rows + 1])
    batch.slots_gpu = torch.empty(len(batch.slots_np), dtype=torch.int64, device=S.DEVICE)  # ok: FC107
    batch.slots_gpu.copy_(torch.from_numpy(batch.slots_np), non_blocking=True)
    prev = batch.slots_gpu[: batch.gbs or batch.bs]
    if batch.is_decode and batch.n_extend:
        # last step's tokens of the decode rows, then the prompt chunk riding along
        ext = S.input_ids_cpu[batch.bs : batch.bs + batch.n_extend].to(S.DEVICE, non_blocking=True)
        S.input_ids = torch.cat([S._STATE["next_tokens"][prev], ext])  # expect: FC107
    elif batch.is_decode:
        torch.index_select(S._STATE["next_tokens"], 0, prev, out=S.input_ids[: prev.numel()])
    else:
        S.input_ids[:n].copy_(S.input_ids_cpu[:n], non_blocking=True)
    if validate:
        logger.info(f"upload: input_ids={S.input_ids[:n]} positions={S.positions[:n]}")  # ok: FC101


def _decode_step(batch):
    bs, gbs = batch.bs, batch.gbs
    logger.debug(f"decode bs={bs} bucket={gbs} kv_tail={S.kv_indptr[bs]}")  # expect: FC101
    if gbs is not None:
        return G.replay(bs, gbs)
    P.plan_decode(bs)
    P.plan_swa(bs)
    if not C.LONG_DECODE_DIRECT:
        P.plan_long(bs)
    if S._STATE["use_cascade"]:  # ok: FC101
        P.plan_cascade(bs)
    if batch.n_extend:
        P.plan_chunk(bs, batch.n_extend)
    A.set_active(decode=W.decode_wrapper, swa=W.swa_decode_wrapper)
    return M.decode_forward(bs, n_extend=batch.n_extend, sample_ext=batch.ext_final)


def _prefill_step(batch):
    P.plan_prefill(batch.bs, batch.num_tokens)
    if not C.LONG_DECODE_DIRECT:
        P.plan_long_prefill(batch.bs)
    return M.prefill_forward(batch.bs, batch.num_tokens)


def post_step(batch, n_sampled):
    global _CHUNKING
    if batch.is_decode:
        S.seq_lens[: batch.bs] += 1  # ok: FC104
    slot = S._STATE["step"] % 2
    S._STATE["tokens_host"][slot, :n_sampled].copy_(S._STATE["sampled"][:n_sampled], non_blocking=True)
    S._STATE["finished_host"][slot, :n_sampled].copy_(S._STATE["finished"][:n_sampled], non_blocking=True)
    done = torch.cuda.Event()
    done.record()
    for r in batch.reqs:
        r.num_computed += batch.q_len_of(r)
    with _LOCK:
        if not batch.is_decode:
            _RUNNING.extend(batch.reqs)
        if batch.ext is not None:
            batch.ext.num_computed += batch.n_extend
            if batch.ext_final:
                _RUNNING.append(batch.ext)
                _CHUNKING = None
    _OUT_Q.put((batch, slot, n_sampled, done))


def step_once():
    """One engine step: schedule, host metadata, upload, plan, graph replay or eager forward, sample."""
    S._STATE["step"] += 1
    batch = schedule()
    if batch is None:
        return None
    bs = batch.bs
    _fill_host_metadata(batch)
    _upload_inputs(batch, validate=False)
    max_len = int(S.seq_lens[: len(batch.rows())].max())  # expect: FC101
    S._STATE["max_seq_len"] = max(max_len, 1)
    logger.debug("step %d bs=%d seq_lens=%s", S._STATE["step"], bs, S.seq_lens[:bs])  # ok: FC101
    if batch.is_decode:
        logits = _decode_step(batch)
    else:
        logits = _prefill_step(batch)
    if logits is None:
        return None
    n_sampled = len(batch.sampled_reqs())
    tokens = SM.sample(logits, n_sampled, batch.slots_gpu, prescaled=batch.gbs is not None)
    post_step(batch, n_sampled)
    return tokens


def _finish(req):
    with _LOCK:
        if req in _RUNNING:
            _RUNNING.remove(req)
        K.release_request(req.req_id, _LAST_ROWS.index(req.req_id) if req.req_id in _LAST_ROWS else None)
        _FREE_SLOTS.append(req.slot)
    req.done.set()


def _output_loop():
    """Output thread: waits for each step's copy, appends tokens, releases finished requests."""
    while True:
        item = _OUT_Q.get()
        if item is None:
            return
        batch, slot, n_sampled, done = item
        done.synchronize()
        tokens = S._STATE["tokens_host"][slot, :n_sampled].tolist()
        finished = S._STATE["finished_host"][slot, :n_sampled].tolist()
        for req, tok, fin in zip(batch.sampled_reqs(), tokens, finished):
            req.output.append(tok)
            req.tokens.append(tok)
            if fin or len(req.output) >= req.max_new_tokens:
                _finish(req)


def serve_forever(idle_sleep_s=0.0005):
    out = threading.Thread(target=_output_loop, name="gsrt-output", daemon=True)
    out.start()
    steps = 0
    try:
        while not _STOP.is_set():
            if step_once() is None:
                time.sleep(idle_sleep_s)
                continue
            steps += 1
            if C.DEFRAG_EVERY and steps % C.DEFRAG_EVERY == 0 and K.free_pages() < S.max_pages // 8:
                K.defragment()
            if steps % 10000 == 0:
                admin.report()
    finally:
        _OUT_Q.put(None)
        out.join(timeout=5)


def setup(args):
    C.apply_args(args)
    C.CASCADE_WS_BYTES = max(args.cascade_ws_mb << 20, C.CASCADE_WS_BYTES)
    if args.long_prefill_ws_mb:
        W.tune_workspace("long_prefill", args.long_prefill_ws_mb << 20)
    S.init_buffers(C.MAX_BS, args.num_pages, C.MAX_NUM_TOKENS)
    K.init_kv_cache(args.num_pages)
    K.set_shared_prefix(C.SHARED_PREFIX_LEN)
    S._STATE["use_cascade"] = C.SHARED_PREFIX_LEN > 0
    _FREE_SLOTS[:] = list(range(C.MAX_BS - 1, -1, -1))
    M.init_weights(args.seed)
    W.init_wrappers(C.MAX_NUM_TOKENS, C.NUM_Q_HEADS, C.HEAD_DIM)
    P.init_plan_fns()
    TR.configure(C.MAX_BS, C.NUM_Q_HEADS, C.HEAD_DIM)
    if C.KV_FP8:
        TR.init_fp8_path(C.MAX_BS, C.NUM_Q_HEADS, args.k_scale, args.v_scale)
    if args.cuda_graph:
        G.warmup_graphs(C.GRAPH_BATCH_SIZES)


def main(argv=None):
    ap = argparse.ArgumentParser("gsrt-serve")
    ap.add_argument("--max-batch-size", type=int, default=C.MAX_BS)
    ap.add_argument("--max-model-len", type=int, default=C.MAX_MODEL_LEN)
    ap.add_argument("--max-num-tokens", type=int, default=C.MAX_NUM_TOKENS)
    ap.add_argument("--chunk-size", type=int, default=C.CHUNK_SIZE)
    ap.add_argument("--num-pages", type=int, default=65536)
    ap.add_argument("--shared-prefix-len", type=int, default=0)
    ap.add_argument("--cascade-ws-mb", type=int, default=64)
    ap.add_argument("--long-prefill-ws-mb", type=int, default=0)
    ap.add_argument("--defrag-every", type=int, default=C.DEFRAG_EVERY)
    ap.add_argument("--k-scale", type=float, default=1.0)
    ap.add_argument("--v-scale", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-cuda-graph", dest="cuda_graph", action="store_false")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    setup(args)
    serve_forever()


if __name__ == "__main__":
    main()
