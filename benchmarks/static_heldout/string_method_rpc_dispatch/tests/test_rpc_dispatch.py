"""Dispatch-by-name tests and kernel smoke tests (GPU tests skip without CUDA)."""

import queue

import pytest
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from rpcserve.config import EngineConfig
from rpcserve.rpc import STEP_RPC_METHODS, CommandQueue, MethodAllowList, RpcError, run_method

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


class _Echo:
    def ping(self, x, *, inc=1):
        return x + inc


def test_run_method_by_name_and_by_function():
    assert run_method(_Echo(), "ping", (1,), {"inc": 2}) == 3  # ok: FC109
    assert run_method(_Echo(), b"ping", (1,)) == 2
    assert run_method(_Echo(), lambda self, x: x * 2, (4,)) == 8


def test_unknown_method_is_not_implemented():
    with pytest.raises(NotImplementedError):
        run_method(_Echo(), "pong")


def test_allow_list_and_queue():
    allow = MethodAllowList(STEP_RPC_METHODS)
    assert allow.check("execute_model") == "execute_model"
    with pytest.raises(RpcError):
        allow.check("__del__")
    q = CommandQueue()
    reply: queue.Queue = queue.Queue(1)
    q.put("check_health", reply=reply)
    (cmd,) = q.drain()
    assert (cmd.method, cmd.args, cmd.reply) == ("check_health", (), reply)


def test_config_adds_verify_capture_mode():
    cfg = EngineConfig(model="tiny", num_speculative_tokens=2)
    assert cfg.capture_modes == ("decode", "target_verify")


@requires_cuda
def test_decode_plan_with_device_indptr_still_runs():
    ws = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")  # ok: FC106
    w = BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
    indptr = torch.tensor([0, 2, 3], dtype=torch.int32, device="cuda")
    indices = torch.tensor([0, 1, 2], dtype=torch.int32, device="cuda")
    last = torch.tensor([16, 5], dtype=torch.int32, device="cuda")
    w.plan(indptr, indices, last, 8, 8, 128, 16, q_data_type=torch.bfloat16)  # ok: FC102
    q = torch.randn(2, 8, 128, dtype=torch.bfloat16, device="cuda")
    kv = torch.randn(3, 2, 16, 8, 128, dtype=torch.bfloat16, device="cuda")
    out = w.run(q, kv)
    assert out.isfinite().all().item()


@requires_cuda
@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability()[0] < 10, reason="needs sm100")
def test_trtllm_decode_smoke():
    ws = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")  # expect: FC105
    q = torch.randn(2, 8, 128, dtype=torch.bfloat16, device="cuda")
    kv = torch.randn(4, 2, 8, 16, 128, dtype=torch.bfloat16, device="cuda")
    block_tables = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32, device="cuda")
    seq_lens = torch.tensor([20, 31], dtype=torch.int32, device="cuda")
    out = trtllm_batch_decode_with_kv_cache(q, kv, ws, block_tables, seq_lens, 32, bmm1_scale=128**-0.5, bmm2_scale=1.0)
    assert out.shape == q.shape
