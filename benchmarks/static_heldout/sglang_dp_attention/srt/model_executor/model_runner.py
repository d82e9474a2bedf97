"""One DP-attention rank's step: eager extend, graph-replayed decode, or an idle step joining the collectives."""
from __future__ import annotations

import torch

from srt.layers.attention import FlashInferDPAttnBackend
from srt.model_executor.cuda_graph_runner import CudaGraphRunner
from srt.model_executor.forward_batch_info import ForwardBatch
from srt.models.gpt_oss import GptOssForCausalLM


class ModelRunner:
    def __init__(self, server_args, cfg, req_to_token_pool, token_to_kv_pool, device: torch.device):
        attn_tp = server_args.tp_size // server_args.dp_size
        self.server_args, self.device, self.sm_version = server_args, device, torch.cuda.get_device_capability(device)[0] * 10
        self.num_heads, self.num_kv_heads = cfg.num_attention_heads // attn_tp, max(1, cfg.num_key_value_heads // attn_tp)
        self.head_dim, self.hidden_size, self.context_len = cfg.head_dim, cfg.hidden_size, cfg.context_len
        self.sliding_window_size = cfg.sliding_window
        self.req_to_token_pool, self.token_to_kv_pool = req_to_token_pool, token_to_kv_pool
        self.attn_backend = FlashInferDPAttnBackend(self)
        self.model = GptOssForCausalLM(cfg, self.attn_backend).to(device)
        self.graph_runner = None if server_args.disable_cuda_graph else CudaGraphRunner(self)
        if self.graph_runner is not None:
            self.graph_runner.capture()

    def forward(self, fb: ForwardBatch) -> torch.Tensor:
        if fb.forward_mode.is_idle():
            return self.forward_idle(fb)
        if fb.forward_mode.is_decode() and self.graph_runner and max(fb.global_num_tokens_cpu) <= self.graph_runner.max_bs:
            return self.graph_runner.replay(fb)
        self.attn_backend.init_forward_metadata(fb)
        run = self.model.forward_decode if fb.forward_mode.is_decode() else self.model.forward_extend
        return run(fb.input_ids, fb.positions, fb)

    def forward_idle(self, fb: ForwardBatch) -> torch.Tensor:
        # an idle rank replays the padded graph with dummy rows so that it meets the other ranks' all-reduces
        fb.batch_size = 0
        bs = self.graph_runner.replay_prepare(fb)
        self.attn_backend.kv_indptr[: bs + 1].zero_()  # expect: FC104
        self.graph_runner.graphs[bs].replay()
        return self.graph_runner.outputs[bs][:0]
