"""Whisper model runner: encoder once per request (its cross K/V cached), decoder steps eager or replayed."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from flashinfer import BatchPrefillWithRaggedKVCacheWrapper

from srt.layers.attention import FlashInferEncDecBackend
from srt.mem_cache.cross_kv_cache import CrossKVCache
from srt.model_executor.cuda_graph_runner import DecoderGraphRunner
from srt.model_executor.forward_batch import EncDecForwardBatch
from srt.models.whisper import WhisperForConditionalGeneration


@dataclass
class WhisperServerArgs:
    page_size: int = 16
    max_running_requests: int = 64
    max_concurrent_encodes: int = 4
    flashinfer_workspace_bytes: int = 256 << 20
    disable_cuda_graph: bool = False


class WhisperModelRunner:
    def __init__(self, model_config, server_args: WhisperServerArgs, token_to_kv_pool, device: torch.device):
        self.model_config, self.server_args, self.device = model_config, server_args, device
        self.token_to_kv_pool = token_to_kv_pool
        max_pages = -(-model_config.max_target_positions // server_args.page_size)
        self.req_to_page = torch.zeros(server_args.max_running_requests, max_pages, dtype=torch.int32, device=device)
        heads = model_config.decoder_attention_heads
        self.cross_cache = CrossKVCache(model_config.decoder_layers, server_args.max_running_requests,
                                        model_config.max_source_positions, heads, model_config.d_model // heads,
                                        torch.float16, device)
        self.model = WhisperForConditionalGeneration(model_config).to(device)
        enc_ws_bytes = server_args.max_concurrent_encodes * model_config.max_source_positions * model_config.d_model * 8
        self.encoder_ws = torch.empty(enc_ws_bytes, dtype=torch.uint8, device=device)  # ok: FC105
        self.encoder_wrapper = BatchPrefillWithRaggedKVCacheWrapper(self.encoder_ws, "NHD", backend="fa2")
        self.attn_backend = FlashInferEncDecBackend(self)
        self.graph_runner = None if server_args.disable_cuda_graph else DecoderGraphRunner(self)

    def add_request(self, req, mel: torch.Tensor) -> None:
        assert mel.shape[-1] == 2 * self.model_config.max_source_positions, "Whisper expects 30 s of log-mel"  # expect: FC109
        self.encode_audio(req, mel)

    @torch.inference_mode()
    def encode_audio(self, req, mel: torch.Tensor) -> None:
        cfg = self.model_config
        heads = cfg.encoder_attention_heads
        indptr = torch.tensor([0, cfg.max_source_positions], dtype=torch.int32)
        self.encoder_wrapper.plan(indptr, indptr, heads, heads, cfg.d_model // heads, causal=False)  # ok: FC102
        feats = self.model.encode(mel.to(self.device, non_blocking=True), self.encoder_wrapper)
        k, v = self.model.project_cross_kv(feats)
        self.cross_cache.put(req.rid, k, v, req)
        req.encoder_len = k.shape[1]
        req.no_speech_prob = self.model.no_speech_prob(feats).item()  # ok: FC101

    def forward_decode(self, batch) -> torch.Tensor:
        self.cross_cache.pack([r.rid for r in batch.reqs])
        fb = EncDecForwardBatch.from_schedule(batch, self)
        if self.graph_runner is not None and self.graph_runner.can_run(fb):
            return self.graph_runner.replay(fb)
        self.attn_backend.init_forward_metadata(fb)
        return self.model(fb.input_ids, fb.positions, fb)

    def reorder_beams(self, parent_rows: torch.Tensor, child_rows: torch.Tensor) -> None:
        """Beam search: every surviving beam continues from its parent's pages (copy-on-write at append)."""
        n = parent_rows.numel()
        scratch = self.attn_backend.kv_indices[: n * self.req_to_page.shape[1]].view(n, -1)
        torch.index_select(self.req_to_page, 0, parent_rows, out=scratch)  # expect: FC104
        self.req_to_page[child_rows] = scratch
