"""CUDA graphs for the decode steps of the Python model path."""

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Dict, Iterator, List

import torch

from rtp_llm.models_py.modules.attn_inputs import AttentionInputs
from rtp_llm.models_py.modules.flashinfer_python import DecodeParams, PyFlashinferDecodeAttnOp

if TYPE_CHECKING:
    from rtp_llm.models_py.model_desc.generic_moe import GenericMoeModel


@dataclass
class GraphInputs:
    input_ids: torch.Tensor
    slot_mapping: torch.Tensor
    outputs: Dict[int, torch.Tensor] = field(default_factory=dict)

    @classmethod
    def allocate(cls, max_tokens: int, *, device: torch.device) -> "GraphInputs":
        return cls(
            input_ids=torch.zeros(max_tokens, dtype=torch.int64, device=device),
            slot_mapping=torch.zeros(max_tokens, dtype=torch.int64, device=device),
        )


class CudaGraphRunner:
    def __init__(
        self,
        model: "GenericMoeModel",
        decode_op: PyFlashinferDecodeAttnOp,
        *,
        batch_sizes: List[int],
        num_speculative: int,
        device: torch.device,
    ):
        if num_speculative < 0:
            raise ValueError(f"num_speculative={num_speculative} must be >= 0")
        self.model = model
        self.decode_op = decode_op
        self.batch_sizes = sorted(batch_sizes)
        self.max_bs = self.batch_sizes[-1]
        self.num_speculative = num_speculative
        self.device = device
        max_tokens = self.max_bs * (num_speculative + 1)
        self.inputs = GraphInputs.allocate(max_tokens, device=device)
        self.hidden_out = torch.zeros(max_tokens, model.config.hidden_size, dtype=model.config.data_type, device=device)  # ok: FC107
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.pool = None
        self.replay_done = torch.cuda.Event()

    def _iter_capture_sizes(self) -> Iterator[int]:
        # largest first, so that the smaller graphs reuse its memory pool
        yield from reversed(self.batch_sizes)

    def capture(self) -> None:
        for bs in self._iter_capture_sizes():
            self.capture_batch(bs)

    def capture_batch(self, bs: int) -> None:
        op = self.decode_op
        op.init_cuda_graph_wrapper(bs)
        q_len = self.num_speculative + 1
        op.params = DecodeParams.for_capture(
            bs, q_len_per_req=q_len, max_blocks=op.max_blocks_per_seq, device=self.device
        )
        op.shared_prefix_len = self.model.shared_prefix_len
        n = bs * q_len
        input_ids = self.inputs.input_ids[:n]
        slot_mapping = self.inputs.slot_mapping[:n]
        torch.cuda.synchronize()  # ok: FC101
        for _ in range(2):  # load the kernels outside the graph
            self.model.decode_step(input_ids, slot_mapping)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = self.model.decode_step(input_ids, slot_mapping)
            self.hidden_out[:n].copy_(out)
        if self.pool is None:
            self.pool = graph.pool()
        self.graphs[bs] = graph

    def can_run(self, attn_inputs: AttentionInputs) -> bool:
        # the trtllm-gen decode reads per-step params that a graph would freeze
        if self.decode_op._backend == "trtllm-gen":  # ok: FC103
            return False
        return attn_inputs.batch_size <= self.max_bs

    def replay(self, inputs, attn_inputs: AttentionInputs) -> torch.Tensor:
        bs = attn_inputs.batch_size
        graph_bs = next(b for b in self.batch_sizes if b >= bs)
        n = inputs.input_ids.shape[0]
        self.inputs.input_ids[:n].copy_(inputs.input_ids, non_blocking=True)  # ok: FC104
        self.inputs.slot_mapping[:n].copy_(inputs.slot_mapping, non_blocking=True)
        self.decode_op.prepare_cuda_graph(attn_inputs)
        # the C++ side may have remapped pages since the inputs were built: refresh the bound table
        self.decode_op.page_indices[: attn_inputs.block_ids.numel()].copy_(attn_inputs.block_ids.flatten())  # expect: FC104
        self.graphs[graph_bs].replay()
        self.replay_done.record()
        # the engine reads the hidden states right after this call returns
        self.replay_done.synchronize()  # expect: FC101
        return self.hidden_out[:n]
