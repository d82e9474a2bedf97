"""NGRAM speculative decoding: drafts from an n-gram table, verified as one chain-tree batch."""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from ..model_executor.forward_batch_info import ForwardBatch, NgramVerifyInput
from .ngram_cache import NgramCache


class NGRAMWorker:
    def __init__(self, server_args, model_runner) -> None:
        self.model_runner, self.attn_backend, self.device = model_runner, model_runner.attn_backend, model_runner.device
        self.draft_token_num = server_args.speculative_num_draft_tokens
        self.match_window = server_args.speculative_ngram_match_window
        self.max_bs = server_args.max_running_requests
        self.cache = NgramCache(max_draft_tokens=self.draft_token_num)
        self._accept_buf: Optional[torch.Tensor] = None
        self.num_draft_tokens = 0

    def prepare_for_verify(self, reqs, seq_lens_cpu: list[int]) -> NgramVerifyInput:
        """Scheduler thread: builds the next batch's drafts while the current batch still runs on the GPU."""
        n = self.draft_token_num
        drafts = self.cache.batch_get([(r.origin_input_ids + r.output_ids)[-self.match_window :] for r in reqs], n - 1)
        tokens = np.zeros((len(reqs), n), dtype=np.int64)
        masks = []
        for i, (req, draft, prefix) in enumerate(zip(reqs, drafts, seq_lens_cpu)):
            tokens[i, 0] = req.output_ids[-1]
            tokens[i, 1 : 1 + len(draft)] = draft
            mask = np.ones((n, prefix + n), dtype=bool)  # chain tree: draft j sees the prefix and drafts 0..j
            mask[:, prefix:] = np.tril(np.ones((n, n), dtype=bool))
            masks.append(mask.ravel())
        mask_np = np.concatenate(masks)
        positions = (np.asarray(seq_lens_cpu)[:, None] + np.arange(n)).ravel()
        to_dev = lambda a: torch.from_numpy(a).pin_memory().to(self.device, non_blocking=True)  # noqa: E731
        if len(reqs) in self.attn_backend.verify_graph_wrappers:
            # graph batches read the packed mask straight from the captured buffer
            packed = np.packbits(mask_np, bitorder="little")
            self.attn_backend.cuda_graph_custom_mask[: packed.size].copy_(to_dev(packed))  # expect: FC104
        spec = NgramVerifyInput(to_dev(tokens.ravel()), to_dev(positions), to_dev(mask_np), n, [len(d) for d in drafts])
        spec.mask_ready = torch.cuda.Event()
        spec.mask_ready.record()
        return spec

    def forward_batch_speculative_generation(self, fb: ForwardBatch):
        spec = fb.spec_info
        bs, n = fb.batch_size, spec.draft_token_num
        if spec.mask_ready is not None:
            spec.mask_ready.synchronize()  # expect: FC101
        self.num_draft_tokens += sum(spec.draft_lens_cpu)  # ok: FC101
        graph_wrapper = self.attn_backend.verify_graph_wrappers.get(bs)
        ran_in_graph = graph_wrapper is not None and getattr(graph_wrapper, "_use_cuda_graph", False)  # expect: FC103
        logits = self.model_runner.forward(fb)
        if ran_in_graph:
            logits = logits.clone()  # the graph's output buffer is rewritten by the next replay
        target = logits.argmax(dim=-1).view(bs, n)
        accept_len = (target[:, :-1] == spec.draft_token.view(bs, n)[:, 1:]).int().cumprod(dim=1).sum(dim=1)
        if self._accept_buf is None:
            self._accept_buf = torch.empty((self.max_bs, n), dtype=torch.int64, device=self.device)  # ok: FC107
        base = torch.arange(bs, device=self.device)[:, None] * n
        steps = torch.arange(n, device=self.device)[None, :]
        accept_index = torch.where(steps <= accept_len[:, None], base + steps, base, out=self._accept_buf[:bs])
        # gather the accepted tokens' cache slots into a preallocated int32 buffer instead of allocating one
        accepted_slots = self.attn_backend.cuda_graph_kv_indices[: bs * n]
        torch.index_select(fb.out_cache_loc.to(torch.int32), 0, accept_index.flatten(), out=accepted_slots)  # expect: FC104
        return target, accept_len, accepted_slots
