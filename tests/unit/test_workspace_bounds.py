"""The oracle's analytic bounds hold for every valid batch: random configurations (heads, head dims, page sizes,
SM counts, limits) and random batches within them never need more than the bound of their wrapper use."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from flashcheck.workspace import EngineConfig, WrapperUse
from flashcheck.workspace.oracle import UseSpec, analytic, plan_for
from flashcheck.workspace.planner import Batch

USES = [
    WrapperUse("prefill", "fa2"),
    WrapperUse("ragged", "fa2"),
    WrapperUse("decode", "tc"),
    WrapperUse("decode", "cuda"),
]
USES += [WrapperUse("prefill", "fa3"), WrapperUse("mla", "fa2"), WrapperUse("batch_attention", "persistent")]


@st.composite
def config_and_batch(draw: st.DrawFn) -> tuple[EngineConfig, UseSpec, Batch]:
    use = draw(st.sampled_from(USES))
    kv_heads = draw(st.sampled_from([1, 2, 4, 8, 16]))
    group = draw(st.sampled_from([1, 2, 4, 8, 16]))
    dims = draw(st.sampled_from([(64, 64), (128, 128), (256, 256), (576, 512), (192, 128)]))
    page = 1 if use.wrapper == "ragged" else draw(st.sampled_from([1, 16, 32, 64]))
    tokens = draw(st.integers(1, 4096))
    spec_len = draw(st.integers(1, 4)) if use.wrapper == "decode" and use.backend == "tc" else 1
    cfg = EngineConfig(
        "random",
        kv_heads * group,
        kv_heads,
        head_dim_qk=dims[0],
        head_dim_vo=dims[1],
        page_size=page,
        max_batch=draw(st.integers(1, 64)),
        max_tokens=max(tokens, spec_len),
        max_seq_len=draw(st.integers(64, 20000)),
        spec_len=spec_len,
        wrappers=(use,),
        num_sms=draw(st.sampled_from([78, 108, 132])),
    )
    fixed = spec_len if use.wrapper == "decode" else None
    bmax = min(cfg.max_batch, cfg.max_tokens // (fixed or 1))
    n = draw(st.integers(1, bmax))
    left = cfg.max_tokens
    groups = []
    for _ in range(n):
        q = fixed or draw(st.integers(1, max(1, min(cfg.qo_cap, left))))
        if q > left:
            break
        left -= q
        groups.append((1, q, draw(st.integers(q, cfg.max_seq_len))))
    rules = draw(st.sampled_from(["0.6", "0.7"]))
    return cfg, UseSpec(use, rules), Batch(tuple(groups) or ((1, fixed or 1, cfg.max_seq_len),))


@settings(max_examples=400, deadline=None)
@given(config_and_batch())
def test_no_valid_batch_exceeds_the_bound(case: tuple[EngineConfig, UseSpec, Batch]) -> None:
    cfg, spec, batch = case
    bounds = analytic(cfg, spec)
    plan = plan_for(cfg, spec, batch)
    assert plan.float_bytes <= bounds["float"][0], (batch.describe(), plan.facts, bounds["float"])
    assert plan.int_bytes <= bounds["int"][0], (batch.describe(), plan.facts, bounds["int"])
