"""The executor loop of the PyTorch flow.

Scheduling, the KV cache and the request objects live in the C++ runtime (``tensorrt_llm.bindings``); this loop
asks the capacity scheduler for the step's requests, prepares the attention metadata from them, runs the model
(replaying a generation graph when the batch allows), samples greedily, verifies MTP drafts, and hands the
sampled tokens to a response thread that waits for the device-to-host copy off the step.
"""
from __future__ import annotations

import logging
import queue
import threading
from typing import Dict, List, Optional, Tuple

import torch
from flashinfer.page import get_batch_indices_positions

from tensorrt_llm.bindings import KVCacheManager, LlmRequest
from tensorrt_llm.bindings.internal.batch_manager import CapacityScheduler
from tensorrt_llm._torch.attention_backend import FlashInferAttentionMetadata, FlashInferBackend
from tensorrt_llm._torch.models import LlamaForCausalLM

from .cuda_graph_runner import CUDAGraphRunner

logger = logging.getLogger(__name__)


class PyExecutor:
    def __init__(
        self, model_config, kv_cache_manager: KVCacheManager, scheduler: CapacityScheduler, max_num_requests: int,
        max_num_tokens: int, max_seq_len: int, max_draft_len: int, graph_batch_sizes: List[int],
        use_trtllm_gen: bool = False, device: str = "cuda",
    ) -> None:
        self.model_config = model_config
        self.kv_cache_manager = kv_cache_manager
        self.scheduler = scheduler
        self.max_num_requests = max_num_requests
        self.max_num_tokens = max_num_tokens
        self.max_draft_len = max_draft_len
        self.tokens_per_req = 1 + max_draft_len
        self.device = device

        self.backend = FlashInferBackend(
            model_config.num_heads, model_config.num_kv_heads, model_config.head_dim, max_num_requests,
            max_num_tokens, max_draft_len, use_trtllm_gen, device,
        )
        tpb = kv_cache_manager.tokens_per_block
        self.attn_metadata = FlashInferAttentionMetadata(
            max_num_requests=max_num_requests,
            max_num_tokens=max_num_tokens,
            max_blocks_per_seq=(max_seq_len + tpb - 1) // tpb,
            max_draft_len=max_draft_len,
            kv_cache_manager=kv_cache_manager,
            workspace_buffer=self.backend.workspace_buffer,
            num_heads=model_config.num_heads,
            num_kv_heads=model_config.num_kv_heads,
            head_dim=model_config.head_dim,
            max_seq_len=max_seq_len,
            device=device,
        )
        self.model = LlamaForCausalLM(model_config, self.backend).to(device)
        self.kv_caches = [kv_cache_manager.get_buffers(i) for i in range(model_config.num_layers)]
        self.graph_runner = CUDAGraphRunner(
            self.model, self.attn_metadata, self.kv_caches, graph_batch_sizes, max_draft_len, device
        )

        n, t = max_num_requests, self.tokens_per_req
        self.input_ids_host = torch.zeros(max_num_tokens, dtype=torch.int64, pin_memory=True)
        self.input_ids_cuda = torch.zeros(max_num_tokens, dtype=torch.int64, device=device)
        self.position_ids_cuda = torch.zeros(max_num_tokens, dtype=torch.int64, device=device)
        self.new_tokens_cuda = torch.zeros(n, t, dtype=torch.int64, device=device)
        self.new_tokens_host = torch.zeros(n, t, dtype=torch.int64, pin_memory=True)
        self.num_accepted_cuda = torch.zeros(n, dtype=torch.int32, device=device)
        self.num_accepted_host = torch.zeros(n, dtype=torch.int32, pin_memory=True)
        self.draft_tokens_host = torch.zeros(n, max(max_draft_len, 1), dtype=torch.int64, pin_memory=True)
        self.draft_tokens_cuda = torch.zeros(n, max(max_draft_len, 1), dtype=torch.int64, device=device)
        self.copy_done = torch.cuda.Event()

        self.active_requests: List[LlmRequest] = []
        self.needs_rewind = False
        self._block_pos: Dict[int, int] = {}
        self._responses: "queue.Queue[Optional[Tuple[List[int], int]]]" = queue.Queue()
        self._shutdown = False
        self._size_workspace_for_limits()
        kv_cache_manager.set_onboard_callback(self.on_blocks_onboarded)
        self._response_thread = threading.Thread(target=self._response_loop, daemon=True)
        self._response_thread.start()

    def warmup(self) -> None:
        dummies = self.kv_cache_manager.add_dummy_requests(
            list(range(max(self.graph_runner.batch_sizes))), self.max_draft_len
        )
        self.graph_runner.capture_all(dummies)

    # ------------------------------------------------------------------ the step

    def step(self) -> None:
        scheduled = self.scheduler.schedule_request(self.active_requests, self.kv_cache_manager)
        if len(scheduled) == 0:
            return
        bs = len(scheduled)
        self._check_batch(bs)
        gen_only = all(not r.is_context_init_state for r in scheduled)
        use_graph = gen_only and self.graph_runner.bucket_for(bs) is not None
        meta = self.graph_runner.metadata_for(bs) if use_graph else self.attn_metadata
        meta.prepare(scheduled)
        self._record_block_positions(meta)
        if meta.is_spec_decoding:
            self.backend.plan_spec(meta)
        self._fill_inputs(meta, scheduled)

        if use_graph:
            drafts = self.draft_tokens_cuda[:bs, : self.max_draft_len]
            logits = self.graph_runner.replay(bs, self.new_tokens_cuda[:bs, :1], drafts, self.position_ids_cuda)
        else:
            nt = meta.num_tokens
            logits = self.model(self.input_ids_cuda[:nt], self.position_ids_cuda[:nt], self.kv_caches, meta)

        if meta.is_spec_decoding:
            self._update_draft_state(bs, logits)
        else:
            last_rows = (meta.qo_indptr_cuda[1 : bs + 1] - 1).long()
            self.new_tokens_cuda[:bs, 0] = torch.argmax(logits.index_select(0, last_rows), dim=-1)

        self.new_tokens_host[:bs].copy_(self.new_tokens_cuda[:bs], non_blocking=True)  # ok: FC101
        self.num_accepted_host[:bs].copy_(self.num_accepted_cuda[:bs], non_blocking=True)
        self.copy_done.record()
        self._responses.put((list(meta.request_ids), bs))

    def _fill_inputs(self, meta: FlashInferAttentionMetadata, scheduled: List[LlmRequest]) -> None:
        by_id = {r.py_request_id: r for r in scheduled}
        nc, n, nt = meta.num_contexts, meta.num_seqs, meta.num_tokens
        pos = 0
        for i, rid in enumerate(meta.request_ids):
            req = by_id[rid]
            if req.is_context_init_state:
                begin = req.context_current_position
                tokens = req.get_tokens(0)[begin : begin + req.context_chunk_size]
            else:
                tokens = [req.get_last_tokens(0)] + list(req.py_draft_tokens)
                drafts = req.py_draft_tokens
                if drafts:
                    self.draft_tokens_host[i - nc, : len(drafts)] = torch.tensor(drafts, dtype=torch.int64)
            self.input_ids_host[pos : pos + len(tokens)] = torch.tensor(tokens, dtype=torch.int64)
            pos += len(tokens)
        self.input_ids_cuda[:nt].copy_(self.input_ids_host[:nt], non_blocking=True)
        self.draft_tokens_cuda[: n - nc].copy_(self.draft_tokens_host[: n - nc], non_blocking=True)

        batch_indices, positions = get_batch_indices_positions(meta.qo_indptr_cuda[: n + 1], meta.kv_lens_cuda[:n], nt)
        meta.batch_indices_cuda[:nt].copy_(batch_indices)
        meta.positions_cuda[:nt].copy_(positions)
        self.position_ids_cuda[:nt].copy_(positions)

    def _update_draft_state(self, bs: int, logits: torch.Tensor) -> None:
        target = torch.argmax(logits[: bs * self.tokens_per_req].view(bs, self.tokens_per_req, -1), dim=-1)
        drafts = self.draft_tokens_cuda[:bs, : self.max_draft_len]
        prefix_ok = (target[:, :-1] == drafts).int().cumprod(dim=1)
        self.num_accepted_cuda[:bs] = prefix_ok.sum(dim=1).int()
        self.new_tokens_cuda[:bs] = target
        if (self.num_accepted_cuda[:bs] < self.max_draft_len).any():  # expect: FC101
            # rejected drafts left KV behind; the response thread rewinds those requests
            self.needs_rewind = True

    def _record_block_positions(self, meta: FlashInferAttentionMetadata) -> None:
        total = int(meta.kv_indptr_host[meta.num_seqs])
        self._block_pos = {blk: pos for pos, blk in enumerate(meta.kv_indices_host[:total].tolist())}  # ok: FC101

    def _check_batch(self, bs: int) -> None:
        assert bs <= self.max_num_requests, "capacity scheduler exceeded max_num_requests"  # ok: FC109

    # ------------------------------------------------------------------ off the step

    def on_blocks_onboarded(self, moves: List[Tuple[int, int]]) -> None:
        """KV cache manager callback, on its event thread: blocks moved from host memory back to the GPU pool.

        Patch the page lists in place so that the next replay reads the new blocks without a full prepare().
        """
        metas: List[FlashInferAttentionMetadata] = [self.attn_metadata, *self.graph_runner.graph_metadata.values()]
        for old_id, new_id in moves:
            pos = self._block_pos.get(old_id)
            if pos is None:
                continue
            for meta in metas:
                meta.kv_indices_host[pos] = new_id  # ok: FC104
                meta.kv_indices_cuda[pos] = new_id  # expect: FC104

    def _response_loop(self) -> None:
        while not self._shutdown:
            item = self._responses.get()
            if item is None:
                return
            request_ids, bs = item
            self.copy_done.synchronize()  # ok: FC101
            tokens = self.new_tokens_host[:bs].tolist()
            accepted = self.num_accepted_host[:bs].tolist()
            for rid, toks, acc in zip(request_ids, tokens, accepted):
                keep = toks[: acc + 1] if self.max_draft_len > 0 else toks[:1]
                self.kv_cache_manager.add_tokens(rid, keep)
                if self.needs_rewind and acc < self.max_draft_len:
                    self.kv_cache_manager.rewind_kv_cache(rid, self.max_draft_len - acc)
            self.needs_rewind = False

    def shutdown(self) -> None:
        self._shutdown = True
        self._responses.put(None)
        self._response_thread.join()

    def _size_workspace_for_limits(self) -> None:
        """Grow the shared FlashInfer workspace when the largest step the limits allow needs more."""
        cfg = self.model_config
        needed = self.max_num_tokens * cfg.num_heads * (cfg.head_dim + 1) * 4 + self.max_num_requests * 64 * 1024
        if needed <= self.backend.workspace_buffer.numel():
            return
        workspace = torch.zeros(needed, dtype=torch.uint8, device=self.device)  # ok: FC106
        self.backend.workspace_buffer = workspace
        self.attn_metadata.rebind_workspace(workspace)
