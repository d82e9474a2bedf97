import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from coattn.config import CompileServeConfig
from coattn.forward_context import get_forward_context, set_forward_context
from coattn.ops import unified_attention


def _inputs(n: int, heads: int = 4, kv_heads: int = 2, dim: int = 64):
    q = torch.randn(n, heads, dim)
    k = torch.randn(n, kv_heads, dim)
    v = torch.randn(n, kv_heads, dim)
    return q, k, v, torch.empty_like(q)


def test_fake_impl_traces_without_context():
    q, k, v, out = _inputs(8)

    def f(q, k, v, out):
        unified_attention(q, k, v, out, "model.layers.0.self_attn")
        return out

    gm = make_fx(f, tracing_mode="fake")(q, k, v, out)
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert torch.ops.coattn.unified_attention.default in targets  # ok: FC109


def test_context_nesting_restores_previous():
    with set_forward_context(None, {}, 4):
        with set_forward_context(None, {}, 2):
            assert get_forward_context().num_tokens == 2
        assert get_forward_context().num_tokens == 4
    with pytest.raises(RuntimeError):
        get_forward_context()


def test_window_layers_alternate():
    cfg = CompileServeConfig(num_layers=4)
    assert [cfg.is_window_layer(i) for i in range(4)] == [False, True, False, True]
