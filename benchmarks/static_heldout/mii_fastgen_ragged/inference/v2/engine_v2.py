"""InferenceEngineV2: put() runs one ragged step, replaying a recorded graph when its padded token bucket has one."""

from __future__ import annotations

import bisect
import logging
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import torch

from .modules import AttnAtoms, ConfigBundle, DSAttentionRegistry, DSSelfAttentionConfig
from .modules.flashinfer_blocked import FlashInferBlockedAttention
from .ragged import BlockedAllocator, DSSequenceDescriptor, RaggedBatchWrapper, RaggedView

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class GraphBucket:
    # one recorded graph per padded token count, with the static tensors it reads and writes
    num_tokens: int
    input_ids: torch.Tensor
    graph: torch.cuda.CUDAGraph = field(default_factory=torch.cuda.CUDAGraph)
    logits: Optional[torch.Tensor] = None


class InferenceEngineV2:
    def __init__(self, model, config: DSSelfAttentionConfig, num_blocks: int, token_buckets: Sequence[int],
                 eos_token_id: int, device: torch.device) -> None:
        self.model = model  # embed / layers / lm_head, each layer: qkv(h) -> q, post(attn_out, h) -> h
        self.config, self.device, self.eos_token_id = config, device, eos_token_id
        self.allocator = BlockedAllocator(num_blocks)
        self.ragged = RaggedBatchWrapper(config.max_seqs, config.max_tokens, config.max_blocks_per_seq,
                                         config.block_size, device)
        self.attn: FlashInferBlockedAttention = DSAttentionRegistry.instantiate_config(
            ConfigBundle("flashinfer_blocked", config), device)
        self.kv_cache = torch.zeros(model.num_layers, num_blocks, 2, config.block_size, config.num_kv_heads,
                                    config.head_size, dtype=config.dtype, device=device)
        self._seqs: Dict[int, DSSequenceDescriptor] = {}
        self._buckets = sorted(token_buckets)
        self._graphs: Dict[int, GraphBucket] = {}
        self.logits_indices = torch.zeros(config.max_seqs, dtype=torch.int64, device=device)
        self._next_tokens: Optional[torch.Tensor] = None

    def _reserve_blocks(self, seq: DSSequenceDescriptor, new_tokens: int) -> None:
        need = -(-(seq.seen_tokens + new_tokens) // self.config.block_size) - len(seq.kv_blocks)
        if need > 0:
            seq.kv_blocks = seq.kv_blocks + self.allocator.allocate(need).tolist()  # ok: FC101

    def defragment(self, old_to_new_host: torch.Tensor) -> None:
        self.attn.remap_blocks(old_to_new_host.to(self.device, non_blocking=True))

    def _run_model(self, input_ids: torch.Tensor, atoms: AttnAtoms) -> torch.Tensor:
        hidden = self.model.embed(input_ids)
        for layer, kv in zip(self.model.layers, self.kv_cache):
            q = layer.qkv(hidden, kv)
            hidden = layer.post(self.attn.forward(q, kv, atoms), hidden)
        return self.model.lm_head(hidden.index_select(0, self.logits_indices))

    def _set_logits_indices(self, view: RaggedView) -> None:
        last_host = view.qo_indptr_host[1:] - 1
        self.logits_indices = torch.empty(view.num_seqs, dtype=torch.int64, device=self.device)  # expect: FC107
        self.logits_indices.copy_(last_host, non_blocking=True)

    def _replay_bucket(self, bucket: GraphBucket, view: RaggedView) -> torch.Tensor:
        self.attn.build_atoms(view, bucket.num_tokens)
        if view.input_ids.numel() < bucket.num_tokens:  # ok: FC101
            bucket.input_ids = torch.zeros(bucket.num_tokens, dtype=torch.int64, device=self.device)  # expect: FC107
        bucket.input_ids[: view.num_tokens].copy_(view.input_ids)
        bucket.graph.replay()
        torch.cuda.current_stream().synchronize()  # expect: FC101
        return bucket.logits

    def put(self, batch_uids: Sequence[int], batch_tokens: Sequence[List[int]]) -> torch.Tensor:
        self.ragged.clear()
        for uid, tokens in zip(batch_uids, batch_tokens):
            if uid not in self._seqs:
                self._seqs[uid] = DSSequenceDescriptor(uid, self.config.max_blocks_per_seq)
            seq = self._seqs[uid]
            self._reserve_blocks(seq, len(tokens))
            self.ragged.insert_sequence(seq, tokens)
        view = self.ragged.finalize()
        logger.debug("put: %d tokens, seq_lens=%s", view.num_tokens, view.seq_lens)  # ok: FC101
        self._set_logits_indices(view)
        i = bisect.bisect_left(self._buckets, view.num_tokens)
        bucket = self._graphs.get(self._buckets[i]) if i < len(self._buckets) else None
        if bucket is not None:
            logits = self._replay_bucket(bucket, view)
        else:
            logits = self._run_model(view.input_ids, self.attn.build_atoms(view, None))
        if self._next_tokens is None:
            self._next_tokens = torch.zeros(self.config.max_seqs, dtype=torch.int64, device=self.device)  # ok: FC107
        n = view.num_seqs
        torch.argmax(logits[:n], dim=-1, out=self._next_tokens[:n])
        for uid in batch_uids:
            self._seqs[uid].post_forward()
        finished = [uid for j, uid in enumerate(batch_uids) if self._next_tokens[j] == self.eos_token_id]  # expect: FC101
        for uid in finished:
            self.allocator.free(self._seqs.pop(uid).kv_blocks)
        return self._next_tokens[:n]

    def _dummy_view(self, num_tokens: int) -> RaggedView:
        """Half the bucket as one-token decodes, the rest as one prefill chunk (Dynamic SplitFuse mix)."""
        self.ragged.clear()
        n_decode = num_tokens // 2
        for k in range(n_decode + 1):
            seq = DSSequenceDescriptor(-1 - k, self.config.max_blocks_per_seq)
            seq.kv_blocks = [0] * self.config.max_blocks_per_seq
            self.ragged.insert_sequence(seq, [0] if k < n_decode else [0] * (num_tokens - n_decode))
        return self.ragged.finalize()

    def capture_buckets(self) -> None:
        self.attn.init_graph_state(self._buckets)
        for n_tok in self._buckets:
            view = self._dummy_view(n_tok)
            bucket = GraphBucket(n_tok, torch.zeros(n_tok, dtype=torch.int64, device=self.device))
            atoms = self.attn.build_atoms(view, n_tok)
            torch.cuda.synchronize()  # ok: FC101
            with torch.cuda.graph(bucket.graph):
                bucket.logits = self._run_model(bucket.input_ids, atoms)
            self._graphs[n_tok] = bucket
