"""FlashCausalLM: batching, CUDA graphs and the per-step forward of the flash models (FlashInfer build)."""

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import torch

from text_generation_server.layers.attention import BLOCK_SIZE, KVCache, Seqlen
from text_generation_server.layers.attention.flashinfer import (
    create_decode_state,
    create_decode_state_cuda_graphs,
    create_prefill_state,
    create_prefill_with_paged_kv_state,
    use_decode_state,
    use_prefill_state,
    use_prefill_with_paged_kv_state,
)
from text_generation_server.models.custom_modeling.flash_llama_modeling import FlashLlamaForCausalLM

logger = logging.getLogger(__name__)

CUDA_GRAPHS = [1, 2, 4, 8, 16, 32]
MEM_POOL = torch.cuda.graph_pool_handle() if torch.cuda.is_available() else None


def block_tables_to_ragged(
    *, block_tables: torch.Tensor, input_lengths: List[int], cache_lengths: List[int]
) -> torch.Tensor:
    """Flatten the padded ``[batch, max_blocks]`` table into FlashInfer's page list (one token per page)."""
    if len(input_lengths) != len(cache_lengths):
        raise ValueError(f"{len(input_lengths)} input lengths for {len(cache_lengths)} cache lengths")
    total_len = sum(input_lengths) + sum(cache_lengths)  # ok: FC101
    ragged = torch.empty(total_len, dtype=torch.int32, device=block_tables.device)
    offset = 0
    for i, (input_length, cache_length) in enumerate(zip(input_lengths, cache_lengths)):
        seq_len = input_length + cache_length
        ragged[offset : offset + seq_len] = block_tables[i, :seq_len]
        offset += seq_len
    return ragged


@dataclass
class FlashCausalLMBatch:
    batch_id: int
    input_ids: torch.Tensor
    position_ids: torch.Tensor
    cu_seqlen_prefill: Optional[torch.Tensor]
    cu_seqlen_prefill_cpu: Optional[torch.Tensor]
    block_tables: torch.Tensor
    slots: torch.Tensor
    input_lengths: List[int]
    cache_lengths: List[int]
    input_lengths_tensor: torch.Tensor
    cache_lengths_tensor: torch.Tensor
    prefill_head_indices: Optional[torch.Tensor]
    max_input_length: int
    speculative_ids: Optional[torch.Tensor] = None
    requests_idx_mapping: Dict[int, int] = field(default_factory=dict)
    next_token_ids: List[int] = field(default_factory=list)

    @property
    def prefilling(self) -> bool:
        return self.cu_seqlen_prefill is not None

    @classmethod
    def from_token_lists(
        cls,
        batch_id: int,
        token_lists: List[List[int]],
        cache_lengths: List[int],
        block_tables: List[List[int]],
        *,
        device: torch.device,
    ) -> "FlashCausalLMBatch":
        assert len(token_lists) == len(cache_lengths) == len(block_tables), "one entry per request"  # expect: FC109
        input_lengths = [len(t) for t in token_lists]
        flat_ids = [tok for toks in token_lists for tok in toks]
        positions = [c + i for toks, c in zip(token_lists, cache_lengths) for i in range(len(toks))]
        slots = [
            block_tables[r][c + i] for r, (toks, c) in enumerate(zip(token_lists, cache_lengths)) for i in range(len(toks))
        ]
        cumulative = [0]
        for n in input_lengths:
            cumulative.append(cumulative[-1] + n)
        cu_seqlen_prefill_cpu = torch.tensor(cumulative, dtype=torch.int32)
        max_blocks = max(len(b) for b in block_tables)
        padded = [b + [0] * (max_blocks - len(b)) for b in block_tables]
        return cls(
            batch_id=batch_id,
            input_ids=torch.tensor(flat_ids, dtype=torch.int64, device=device),
            position_ids=torch.tensor(positions, dtype=torch.int32, device=device),
            cu_seqlen_prefill=cu_seqlen_prefill_cpu.to(device, non_blocking=True),
            cu_seqlen_prefill_cpu=cu_seqlen_prefill_cpu,
            block_tables=torch.tensor(padded, dtype=torch.int32, device=device),
            slots=torch.tensor(slots, dtype=torch.int64, device=device),
            input_lengths=input_lengths,
            cache_lengths=list(cache_lengths),
            input_lengths_tensor=torch.tensor(input_lengths, dtype=torch.int32, device=device),
            cache_lengths_tensor=torch.tensor(cache_lengths, dtype=torch.int32, device=device),
            prefill_head_indices=torch.tensor(cumulative[1:], dtype=torch.int64, device=device) - 1,
            max_input_length=max(input_lengths),
        )


class FlashCausalLM:
    def __init__(
        self,
        model: FlashLlamaForCausalLM,
        *,
        num_layers: int,
        num_heads: int,
        num_kv_heads: int,
        head_size: int,
        dtype: torch.dtype,
        device: torch.device,
        max_batch_prefill_tokens: int,
        max_speculative: int = 0,
        sliding_window: Optional[int] = None,
        cuda_graphs: Optional[List[int]] = None,
    ):
        self.model = model
        self.num_layers = num_layers
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_size = head_size
        self.dtype = dtype
        self.kv_cache_dtype = dtype
        self.device = device
        self.max_batch_prefill_tokens = max_batch_prefill_tokens
        self.max_speculative = max_speculative
        self.sliding_window = sliding_window
        self.cuda_graph_sizes = cuda_graphs if cuda_graphs is not None else CUDA_GRAPHS
        self.kv_cache: List[KVCache] = []
        self.cuda_graphs: Dict[int, Dict[str, Any]] = {}
        self._spec_arange: Optional[torch.Tensor] = None
        self.step_lengths_host: Optional[torch.Tensor] = None
        self.prefill_state = create_prefill_state(
            device=device, max_batch_prefill_tokens=max_batch_prefill_tokens, num_heads=num_heads
        )
        self.prefill_with_paged_kv_state = create_prefill_with_paged_kv_state(device=device)
        self.decode_state = create_decode_state(device=device, num_heads=num_heads, num_kv_heads=num_kv_heads)

    def init_kv_cache(self, num_blocks: int) -> None:
        self.kv_cache = [
            KVCache(
                num_blocks=num_blocks,
                num_heads=self.num_kv_heads,
                head_size=self.head_size,
                dtype=self.kv_cache_dtype,
                device=self.device,
            )
            for _ in range(self.num_layers)
        ]

    def _forward_context(
        self,
        *,
        block_tables: torch.Tensor,
        cu_seqlen_prefill: Optional[torch.Tensor],
        cu_seqlen_prefill_cpu: Optional[torch.Tensor],
        has_cache: bool,
        input_lengths_tensor: torch.Tensor,
        cache_lengths_tensor: torch.Tensor,
        state=None,
    ):
        """The context manager that plans the right wrapper and publishes it for the attention layers."""
        if cu_seqlen_prefill is None:
            return use_decode_state(
                state=state if state is not None else self.decode_state,
                kv_lengths=input_lengths_tensor + cache_lengths_tensor,
                block_tables=block_tables,
                num_heads=self.num_heads,
                num_kv_heads=self.num_kv_heads,
                head_size=self.head_size,
                page_size=BLOCK_SIZE,
                kv_cache_dtype=self.kv_cache_dtype,
                q_dtype=self.dtype,
                window_left=self.sliding_window,
            )
        num_tokens = int(cu_seqlen_prefill_cpu[-1])  # ok: FC101
        if not has_cache and num_tokens <= self.max_batch_prefill_tokens:
            return use_prefill_state(
                state=self.prefill_state,
                cu_seqlens_cpu=cu_seqlen_prefill_cpu,
                num_heads=self.num_heads,
                num_kv_heads=self.num_kv_heads,
                head_size=self.head_size,
                q_dtype=self.dtype,
                window_left=self.sliding_window,
            )
        return use_prefill_with_paged_kv_state(
            state=self.prefill_with_paged_kv_state,
            block_tables=block_tables,
            cu_seqlens=cu_seqlen_prefill,
            kv_lengths=input_lengths_tensor + cache_lengths_tensor,
            num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
            head_size=self.head_size,
            page_size=BLOCK_SIZE,
            kv_dtype=self.kv_cache_dtype,
            q_dtype=self.dtype,
            window_left=self.sliding_window,
        )

    def cuda_graph_warmup(self, bs: int, max_s: int, max_bt: int) -> None:
        input_ids = torch.zeros(bs, dtype=torch.int64, device=self.device)
        position_ids = torch.zeros(bs, dtype=torch.int32, device=self.device)
        slots = torch.arange(bs, dtype=torch.int64, device=self.device)
        input_lengths = [max_s] * bs
        cache_lengths = [0] * bs
        input_lengths_tensor = torch.full((bs,), max_s, dtype=torch.int32, device=self.device)
        cache_lengths_tensor = torch.zeros(bs, dtype=torch.int32, device=self.device)
        padded_table = torch.arange(max_bt, dtype=torch.int32, device=self.device).repeat(bs).reshape(bs, max_bt)
        block_tables = block_tables_to_ragged(
            block_tables=padded_table, input_lengths=input_lengths, cache_lengths=cache_lengths
        )
        block_tables_ptr = torch.zeros(bs + 1, dtype=torch.int32, device=self.device)
        last_page_len = torch.empty(bs, dtype=torch.int32, device=self.device)
        state = create_decode_state_cuda_graphs(
            device=self.device,
            block_tables=block_tables,
            block_tables_ptr=block_tables_ptr,
            last_page_len=last_page_len,
            num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
        )
        graph = torch.cuda.CUDAGraph()
        self.cuda_graphs[bs] = {
            "input_ids": input_ids,
            "position_ids": position_ids,
            "block_tables": block_tables,
            "block_tables_ptr": block_tables_ptr,
            "last_page_len": last_page_len,
            "slots": slots,
            "input_lengths": input_lengths_tensor,
            "cache_lengths": cache_lengths_tensor,
            "state": state,
            "graph": graph,
        }
        torch.cuda.synchronize()  # ok: FC101
        with self._forward_context(
            block_tables=block_tables,
            cu_seqlen_prefill=None,
            cu_seqlen_prefill_cpu=None,
            has_cache=True,
            input_lengths_tensor=input_lengths_tensor,
            cache_lengths_tensor=cache_lengths_tensor,
            state=state,
        ):
            seqlen = Seqlen(input_lengths=input_lengths_tensor, cache_lengths=cache_lengths_tensor, max_k=max_s)
            # one eager run so that the kernels are loaded before the capture
            self.model.forward(
                input_ids=input_ids,
                position_ids=position_ids,
                cu_seqlen_prefill=None,
                kv_cache=self.kv_cache,
                slots=slots,
                seqlen=seqlen,
                max_s=max_s,
            )
            torch.cuda.synchronize()
            with torch.cuda.graph(graph, pool=MEM_POOL):
                seqlen = Seqlen(input_lengths=input_lengths_tensor, cache_lengths=cache_lengths_tensor, max_k=max_s)
                logits, speculative_logits = self.model.forward(
                    input_ids=input_ids,
                    position_ids=position_ids,
                    cu_seqlen_prefill=None,
                    kv_cache=self.kv_cache,
                    slots=slots,
                    seqlen=seqlen,
                    max_s=max_s,
                )
                logger.debug("captured bs=%d with %d kv tokens", bs, seqlen.cu_seqlen_k[-1].item())  # expect: FC101
        self.cuda_graphs[bs]["logits"] = logits
        self.cuda_graphs[bs]["speculative_logits"] = speculative_logits
        torch.cuda.synchronize()

    def warmup(self, batch: FlashCausalLMBatch, *, num_blocks: int, max_total_tokens: int) -> int:
        self.init_kv_cache(num_blocks)
        self.generate_token(batch)
        torch.cuda.synchronize(self.device)
        free_memory, _ = torch.cuda.mem_get_info(self.device)
        # every tensor-parallel rank must size its cache from the same number
        free_t = torch.tensor([free_memory], dtype=torch.int64, device=self.device)
        if torch.distributed.is_initialized():
            torch.distributed.all_reduce(free_t, op=torch.distributed.ReduceOp.MIN)
        free_memory = free_t.item()  # ok: FC101
        ws_bytes = self.decode_state._float_workspace_buffer.numel()  # expect: FC103
        logger.info("free memory %d bytes after warmup, FlashInfer workspace %d bytes", free_memory, ws_bytes)
        max_bt = (max_total_tokens + BLOCK_SIZE - 1) // BLOCK_SIZE
        for bs in self.cuda_graph_sizes:
            self.cuda_graph_warmup(bs, max_total_tokens, max_bt)
        return free_memory

    def forward(self, batch: FlashCausalLMBatch) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        assert self.kv_cache, "warmup() allocates the KV cache before the first forward"  # ok: FC109
        input_ids = batch.input_ids
        position_ids = batch.position_ids
        cu_seqlen_prefill = batch.cu_seqlen_prefill
        block_tables = batch.block_tables
        slots = batch.slots
        input_lengths = batch.input_lengths_tensor
        cache_lengths_tensor = batch.cache_lengths_tensor
        host_input_lengths = batch.input_lengths
        host_cache_lengths = batch.cache_lengths
        max_s = max(i + c for i, c in zip(host_input_lengths, host_cache_lengths))  # ok: FC101
        lm_head_indices = batch.prefill_head_indices

        if batch.speculative_ids is not None:
            # Verify the speculated tokens: every request becomes speculative_length + 1 rows.
            speculative_ids = batch.speculative_ids
            B, speculative_length = speculative_ids.shape
            new_length = speculative_length + 1
            if self._spec_arange is None:
                self._spec_arange = torch.arange(self.max_speculative + 1, dtype=torch.int32, device=self.device)  # ok: FC107
            arange = self._spec_arange[:new_length].unsqueeze(0)
            input_ids = torch.cat([input_ids.unsqueeze(-1), speculative_ids], dim=1).reshape(-1)
            position_ids = (position_ids.unsqueeze(-1).expand(B, new_length) + arange).view(-1)
            slots = (slots.unsqueeze(-1).expand(B, new_length) + arange).view(-1)
            input_lengths = (input_lengths.unsqueeze(-1).expand(B, new_length) + arange).view(-1)
            cache_lengths_tensor = cache_lengths_tensor.unsqueeze(-1).expand(B, new_length).reshape(-1)
            block_tables = block_tables.unsqueeze(1).expand(B, new_length, -1).reshape(B * new_length, -1)
            # the ragged conversion below walks host lists
            host_input_lengths = input_lengths.tolist()  # expect: FC101
            host_cache_lengths = [c for c in host_cache_lengths for _ in range(new_length)]
            max_s = max_s + speculative_length
            lm_head_indices = None

        # Host copy of this step's lengths, read by the router's metrics after the step.
        self.step_lengths_host = torch.empty(len(host_input_lengths), dtype=torch.int32, pin_memory=True)  # ok: FC107
        self.step_lengths_host.numpy()[:] = host_input_lengths

        bs = input_ids.shape[0]
        graph_sizes = [k for k in sorted(self.cuda_graphs) if k >= bs]
        cuda_graph = self.cuda_graphs[graph_sizes[0]] if graph_sizes and cu_seqlen_prefill is None else None
        ragged = block_tables_to_ragged(
            block_tables=block_tables, input_lengths=host_input_lengths, cache_lengths=host_cache_lengths
        )

        if cuda_graph is None:
            with self._forward_context(
                block_tables=ragged,
                cu_seqlen_prefill=cu_seqlen_prefill,
                cu_seqlen_prefill_cpu=batch.cu_seqlen_prefill_cpu,
                has_cache=any(c > 0 for c in host_cache_lengths),
                input_lengths_tensor=input_lengths,
                cache_lengths_tensor=cache_lengths_tensor,
            ):
                seqlen = Seqlen(
                    input_lengths=input_lengths,
                    cache_lengths=cache_lengths_tensor,
                    cu_seqlen_q=cu_seqlen_prefill,
                    max_q=batch.max_input_length,
                )
                out = self.model.forward(
                    input_ids=input_ids,
                    position_ids=position_ids,
                    cu_seqlen_prefill=cu_seqlen_prefill,
                    kv_cache=self.kv_cache,
                    slots=slots,
                    seqlen=seqlen,
                    max_s=max_s,
                    lm_head_indices=lm_head_indices,
                )
            return out.logits, out.speculative_logits

        # Static inputs of the graph are padded to its batch size.
        cuda_graph["input_ids"][: input_ids.shape[0]] = input_ids
        cuda_graph["position_ids"][: position_ids.shape[0]] = position_ids
        cuda_graph["block_tables"][: ragged.shape[0]] = ragged  # ok: FC104
        cuda_graph["slots"].fill_(-1)
        cuda_graph["slots"][: slots.shape[0]] = slots
        cuda_graph["input_lengths"].zero_()
        cuda_graph["input_lengths"][: input_lengths.shape[0]] = input_lengths
        cuda_graph["cache_lengths"].zero_()
        cuda_graph["cache_lengths"][: cache_lengths_tensor.shape[0]] = cache_lengths_tensor
        with self._forward_context(
            block_tables=cuda_graph["block_tables"],
            cu_seqlen_prefill=None,
            cu_seqlen_prefill_cpu=None,
            has_cache=True,
            input_lengths_tensor=cuda_graph["input_lengths"],
            cache_lengths_tensor=cuda_graph["cache_lengths"],
            state=cuda_graph["state"],
        ):
            # padded rows repeat the last real offset so that the kernel sees them as empty
            cuda_graph["block_tables_ptr"][bs + 1 :] = cuda_graph["block_tables_ptr"][bs]  # expect: FC104
            cuda_graph["graph"].replay()
        speculative_logits = cuda_graph["speculative_logits"]
        if speculative_logits is not None:
            speculative_logits = speculative_logits[:bs]
        return cuda_graph["logits"][:bs], speculative_logits

    def generate_token(self, batch: FlashCausalLMBatch) -> Tuple[List[int], FlashCausalLMBatch]:
        start = time.time_ns()
        logits, speculative_logits = self.forward(batch)
        next_input_ids = torch.argmax(logits, dim=-1)
        if batch.prefilling and self.cuda_graphs:
            # A prefill may have evicted pages that the largest decode graph still lists: scrub its table.
            largest = self.cuda_graphs[max(self.cuda_graphs)]
            largest["block_tables"].zero_()  # expect: FC104
        # The router streams the new tokens: one read-back per step, after the forward.
        next_token_ids = next_input_ids.tolist()  # ok: FC101
        batch.next_token_ids = next_token_ids
        batch.input_ids = next_input_ids
        batch.position_ids = batch.position_ids + 1
        batch.cache_lengths = [c + i for c, i in zip(batch.cache_lengths, batch.input_lengths)]
        batch.input_lengths = [1] * len(batch.input_lengths)
        batch.cu_seqlen_prefill = None
        batch.cu_seqlen_prefill_cpu = None
        batch.prefill_head_indices = None
        logger.debug("step took %.2f ms", (time.time_ns() - start) / 1e6)
        return next_token_ids, batch
