"""Backends dispatch on the config class, metadata and graph inputs on the batch class, attention on the metadata."""
import functools
import logging
import math

import torch

from sdengine.batches import DecodeBatch, PrefillBatch, TrtllmDecodeBatch
from sdengine.config import AttentionConfig, DecodeConfig, EngineConfig, TrtllmConfig

from .backend import FlashInferBackend
from .factories import DecodeMeta, PrefillMeta, TrtllmMeta, plan_dims
from .trtllm_path import TrtllmDecodePath

logger = logging.getLogger(__name__)
Backend = FlashInferBackend | TrtllmDecodePath


@functools.singledispatch
def make_backend(acfg: AttentionConfig, cfg: EngineConfig, device: torch.device) -> Backend:
    raise TypeError(f"no backend registered for {type(acfg).__name__}")


make_backend.register(DecodeConfig, lambda acfg, cfg, device: FlashInferBackend.from_config(cfg, device))
make_backend.register(TrtllmConfig, lambda acfg, cfg, device: TrtllmDecodePath.from_config(cfg, device))


@functools.singledispatch
def build_metadata(batch, backend: Backend):
    raise NotImplementedError(f"no metadata recipe for {type(batch).__name__}")


@build_metadata.register
def build_decode_metadata(batch: DecodeBatch, backend: FlashInferBackend) -> DecodeMeta:
    assert batch.batch_size <= backend.max_bs, "decode batch exceeds max_batch_size"  # expect: FC109
    backend.decode_wrapper.plan(  # expect: FC102
        batch.kv_indptr_cpu, batch.kv_indices, batch.kv_last_page_len, *plan_dims(backend.acfg)
    )
    meta = DecodeMeta(backend.decode_wrapper, None, batch.batch_size)
    if (batch.seq_lens > backend.acfg.sliding_window).any():  # expect: FC101
        plan_window = functools.partial(backend.window_wrapper.plan, window_left=backend.acfg.sliding_window)
        plan_window(batch.kv_indptr_cpu, batch.kv_indices, batch.kv_last_page_len_cpu, *plan_dims(backend.acfg))  # ok: FC102
        meta.window_wrapper = backend.window_wrapper
    logger.debug("decode plan bs=%d longest=%s", batch.batch_size, batch.seq_lens.max())  # ok: FC101
    meta.seq_lens = batch.seq_lens.clone()  # ok: FC107
    if backend.cfg.trtllm.num_draft_tokens:
        backend.plan_draft(batch)
    return meta


@build_metadata.register
def _(batch: PrefillBatch, backend: FlashInferBackend) -> PrefillMeta:
    a = backend.cfg.prefill
    if batch.prefix_lens_cpu.any():  # ok: FC101
        logger.info("prefix-cached prefill, %d cached tokens", int(batch.prefix_lens_cpu.sum()))
    longest_prefix = batch.prefix_lens.max().item()  # expect: FC101
    qo_lens_host = torch.diff(batch.qo_indptr).to("cpu")  # expect: FC101
    if qo_lens_host.max() > a.max_num_tokens:  # ok: FC101
        raise ValueError(f"prefill chunk of {int(qo_lens_host.max())} tokens > max_num_tokens={a.max_num_tokens}")
    if longest_prefix > a.sliding_window:
        raise NotImplementedError("cached prefixes longer than the window need the paged prefix path")
    backend.ragged_wrapper.plan(  # expect: FC102
        batch.qo_indptr, batch.qo_indptr_cpu, a.num_qo_heads, a.num_kv_heads, a.head_dim, causal=a.causal
    )
    num_tokens = batch.num_tokens
    rows = torch.arange(len(batch.prefix_lens_cpu), device=batch.qo_indptr.device)
    token_to_req = torch.repeat_interleave(rows, torch.diff(batch.qo_indptr), output_size=num_tokens)  # ok: FC101
    fresh_rows = batch.qo_indptr[:-1][batch.prefix_lens == 0]  # expect: FC101
    return PrefillMeta(backend.ragged_wrapper, num_tokens, token_to_req, fresh_rows)


@build_metadata.register
def _(batch: TrtllmDecodeBatch, backend: TrtllmDecodePath) -> TrtllmMeta:
    if math.ceil(batch.max_seq_len / backend.tcfg.page_size) > backend.pages_per_row:  # ok: FC101
        raise ValueError(f"a request needs more than {backend.pages_per_row} pages")
    backend.plan_eager(batch)
    return TrtllmMeta(batch.batch_size, batch.seq_lens, graph=False)


@functools.singledispatch
def prepare_graph_inputs(batch, backend: Backend, bs: int) -> None:
    raise NotImplementedError(f"{type(batch).__name__} has no graph path")


@prepare_graph_inputs.register
def _(batch: DecodeBatch, backend: FlashInferBackend, bs: int) -> None:
    n = batch.batch_size
    backend.last_page_len_buf[:n].copy_(batch.kv_last_page_len, non_blocking=True)  # ok: FC104
    backend.plan_replay(batch, bs)
    _pad_indptr(backend.kv_indptr_buf, n, bs)  # expect: FC104


prepare_graph_inputs.register(TrtllmDecodeBatch, lambda batch, backend, bs: backend.prepare_replay(batch, bs))


def _pad_indptr(indptr: torch.Tensor, n: int, bs: int) -> None:
    indptr[n + 1 : bs + 1] = indptr[n]  # padded rows attend to no pages


@functools.singledispatch
def run_attention(meta, backend: Backend, q, k, v, kv_cache: torch.Tensor, layer_id: int) -> torch.Tensor:
    raise NotImplementedError(f"no attention for {type(meta).__name__}")


@run_attention.register
def _(meta: DecodeMeta, backend: FlashInferBackend, q, k, v, kv_cache, layer_id):
    return backend.forward_decode(meta, q, kv_cache, layer_id)


run_attention.register(PrefillMeta, lambda meta, backend, q, k, v, kv, layer_id: backend.forward_extend(meta, q, k, v))
run_attention.register(TrtllmMeta, lambda meta, backend, q, k, v, kv, layer_id: backend.forward(meta, q, kv, layer_id))
