"""The workspace oracle: planner allocations against hand-computed cases from FlashInfer's formulas, the search's
witnesses, FC306 firing and staying quiet, the CLI's exit codes and the TOML configuration."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from flashcheck.cli import main
from flashcheck.errors import InvalidArgument
from flashcheck.workspace import EngineConfig, WrapperUse, load_toml, preset, run_oracle
from flashcheck.workspace.oracle import UseSpec, plan_for, search
from flashcheck.workspace.planner import Alloc, Batch, Shape, aligned_end, decode_cuda_plan, fa2_plan, mla_plan
from flashcheck.workspace.report import findings, witness_repro

LLAMA = Shape(32, 8, 128, 128, 16)
H64 = Shape(64, 8, 128, 128, 16)


def test_aligned_end_pads_each_allocation_to_its_alignment() -> None:
    assert aligned_end([Alloc("a", 4, 1), Alloc("b", 8, 16), Alloc("c", 1, 16)]) == 16 + 8 + 8 + 1


def test_fa2_eager_split_hand_computed_0_6_and_0_7() -> None:
    # 1 request, 16 query rows x group 8 = 128 packed rows > 64: cta_tile_q 128; 264 pages = 33 chunks of 8 pages,
    # the most CTAs that fit 2 * 132 SMs / 8 KV heads = 33
    batch = Batch.of([16], [264 * 16])
    p6 = fa2_plan(H64, batch, rules="0.6", num_sm=132)
    assert p6.facts == {"padded_batch_size": 33, "new_batch_size": 33, "split_kv": 1, "cta_tile_q": 128}
    tmp_v, tmp_s = 64 * 33 * 128 * 128 * 4, 64 * 33 * 128 * 4  # H * padded * cta * d_vo * 4, H * padded * cta * 4
    assert p6.float_bytes == tmp_v + tmp_s
    # 0.7 counts query rows: ceil(33 * 128 / 8) = 528
    p7 = fa2_plan(H64, batch, rules="0.7", num_sm=132)
    assert p7.float_bytes == 64 * 528 * 128 * 4 + 64 * 528 * 4
    # int: 3 x int32[33] (132 -> 144 aligned), o_indptr int32[2], chunk size, merge_indptr int32[17], mask[33]
    ints6 = [(132, 16), (132, 16), (132, 16), (8, 16), (4, 1), (68, 16), (33, 16)]
    assert p6.int_bytes == aligned_end([Alloc("x", s, a) for s, a in ints6])
    assert p7.int_bytes == aligned_end([Alloc("x", s, a) for s, a in ints6[:-1]])  # eager 0.7: no mask


def test_fa2_short_kv_does_not_split_and_needs_no_float() -> None:
    p = fa2_plan(LLAMA, Batch.of([100], [100]), rules="0.6", num_sm=132)
    assert p.facts["split_kv"] == 0 and p.float_bytes == 0


def test_fa2_graph_padded_batch_is_the_cta_budget_or_the_tile_bound() -> None:
    # decode bucket 256, one row each: cta 16 (packed 4), tiles ceil(256*4/16) + 255 = 319 > 2*132/8 = 33
    p = fa2_plan(LLAMA, Batch(((256, 1, 100),)), rules="0.6", num_sm=132, graph=True, total_rows=256)
    assert p.facts["padded_batch_size"] == 319 and p.facts["cta_tile_q"] == 16
    assert p.float_bytes == aligned_end([Alloc("v", 32 * 319 * 16 * 128 * 4), Alloc("s", 32 * 319 * 16 * 4)])


def test_decode_cuda_graph_pads_to_grid_over_kv_heads() -> None:
    p = decode_cuda_plan(LLAMA, Batch(((4, 1, 64),)), max_grid_size=132 * 8, graph=True)
    assert p.facts["padded_batch_size"] == 132 and p.facts["split_kv"] == 1
    assert p.float_bytes == aligned_end([Alloc("v", 32 * 132 * 128 * 4), Alloc("s", 32 * 132 * 4)])
    eager = decode_cuda_plan(LLAMA, Batch(((4, 1, 64),)), max_grid_size=132 * 8)
    assert eager.facts["split_kv"] == 0 and eager.float_bytes == 0


def test_mla_sizes_are_fixed_arrays() -> None:
    s = Shape(16, 1, 576, 512, 1)
    p = mla_plan(s, Batch.of([1], [10]), num_sm=132)
    assert p.float_bytes == aligned_end([Alloc("o", 2 * 132 * 64 * 2 * 512), Alloc("l", 2 * 132 * 64 * 4)])
    assert p.int_bytes == 9 * 16384 * 4 + 5 * 528


def test_search_finds_the_maximising_witness_and_the_bound_is_reached() -> None:
    cfg = preset("prefill-64h-16mib")
    res = run_oracle(cfg)
    for rules in ("0.6", "0.7"):
        b = next(x for x in res.bounds if x.kind == "float" and x.rules == rules)
        assert b.basis == "proven" and b.tight
        assert b.witness is not None
        p = plan_for(cfg, UseSpec(cfg.wrappers[0], rules), b.witness)  # type: ignore[arg-type]
        assert p.float_bytes == b.searched and p.facts["padded_batch_size"] == 33 and p.facts["cta_tile_q"] == 128


def test_search_never_beats_the_bound_on_any_preset() -> None:
    for name in ("llama3-8b-decode", "llama3-8b-prefill", "deepseek-v3-mla-tp8", "decode-cuda", "ragged-fa3"):
        for b in run_oracle(preset(name)).bounds:
            assert 0 <= b.searched <= b.bound, (name, b.use, b.kind)


def test_search_random_part_is_seeded() -> None:
    cfg = preset("ragged-fa2")
    spec = UseSpec(cfg.wrappers[0], "0.6")
    assert search(cfg, spec, seed=3)["int"][0] == search(cfg, spec, seed=3)["int"][0]


def test_shortfall_fires_with_a_replayable_witness(tmp_path: Path) -> None:
    found = findings(run_oracle(preset("prefill-64h-16mib")), tmp_path)
    assert [(f.id, f.evidence["kind"], f.evidence["flashinfer_rules"]) for f in found] == [
        ("FC306", "float", "0.6"),
        ("FC306", "float", "0.7"),
    ]
    f7 = found[1]
    assert f7.severity.value == "error" and f7.evidence["configured_bytes"] == 16 << 20
    assert f7.evidence["searched_bytes"] == 64 * 528 * 128 * 4 + 64 * 528 * 4 > 16 << 20
    assert f7.repro is not None
    doc = json.loads(Path(f7.repro).read_text())
    assert doc["finding"]["id"] == "FC302" and doc["finding"]["evidence"]["check"] == "exception"
    step = doc["scenario"]["steps"][0]
    assert (step["op"], step["qo_lens"], step["kv_lens"]) == ("eager", [9], [4224])
    from flashcheck.scenario import Scenario
    from flashcheck.targets.registry import make_target

    sc = Scenario.from_dict(doc["scenario"])
    t = make_target(sc.target, **dict(sc.target_config))
    cap = t.capacity
    assert cap.template.num_qo_heads == 64 and t.workspace_bytes == 16 << 20  # type: ignore[attr-defined]
    assert max(step["qo_lens"]) <= cap.max_qo_len and max(step["kv_lens"]) <= cap.max_kv_len


def test_shortfall_stays_quiet_at_the_recommended_size() -> None:
    res = run_oracle(preset("prefill-64h-16mib"))
    ok = preset("prefill-64h-16mib").replace(float_bytes=res.recommended("float"))
    assert findings(run_oracle(ok)) == []
    assert res.recommended("float") >= res.required("float") == 139_493_376


def test_shortfall_below_the_bound_only_is_a_warning() -> None:
    cfg = preset("llama3-8b-prefill")
    int_b = next(b for b in run_oracle(cfg).bounds if b.kind == "int")
    between = (int_b.searched + int_b.bound) // 2
    found = [f for f in findings(run_oracle(cfg.replace(int_bytes=between))) if f.evidence["kind"] == "int"]
    assert found and all(f.severity.value == "warning" and f.repro is None for f in found)


def test_graph_witness_repro_captures_the_bucket() -> None:
    cfg = preset("decode-tc").replace(float_bytes=1 << 20)
    res = run_oracle(cfg)
    b = next(x for x in res.bounds if x.use == "decode-tc graph bs=32" and x.kind == "float")
    doc = witness_repro(cfg, b)
    assert doc is not None
    assert doc["scenario"]["steps"][0]["op"] == "capture" and doc["scenario"]["steps"][0]["bucket"] == 32


def test_cli_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["workspace", "--preset", "llama3-8b-decode"]) == 0
    assert "verdict: covered" in capsys.readouterr().out
    assert main(["workspace", "--preset", "prefill-64h-16mib", "--repro-dir", str(tmp_path)]) == 1
    assert "FC306" in capsys.readouterr().out and len(list(tmp_path.glob("*.json"))) == 2
    assert main(["workspace", "--preset", "llama3-8b-prefill", "--format", "json", "--float-bytes", "1024"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["verdict"] == "shortfall" and doc["configured"]["float"] == 1024


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        ([], "give --preset NAME or --config"),
        (["--preset", "nope"], "unknown preset 'nope'"),
        (["--config", "/nonexistent/x.toml"], "does not exist"),
        (["--preset", "llama3-8b-decode", "--float-bytes", "lots"], "--float-bytes must be an integer"),
        (["--preset", "llama3-8b-decode", "--num-kv-heads", "5"], "not a multiple of num_kv_heads=5"),
    ],
)
def test_cli_bad_input_is_one_line_exit_2(argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["workspace", *argv]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1


TOML = """
name = "my-engine"
flashinfer = "0.7.2"
[model]
num_qo_heads = 64
num_kv_heads = 8
[scheduler]
page_size = 16
max_batch = 128
max_tokens = 8192
max_seq_len = 32768
graph_buckets = [1, 2, 4, 8]
[[wrappers]]
wrapper = "decode"
backend = "tc"
graph = true
[[wrappers]]
wrapper = "prefill"
backend = "fa2"
[workspace]
float_bytes = 268435456
"""


def test_toml_parsing(tmp_path: Path) -> None:
    p = tmp_path / "engine.toml"
    p.write_text(TOML)
    cfg = load_toml(p)
    assert cfg == EngineConfig(
        "my-engine",
        64,
        8,
        max_batch=128,
        max_tokens=8192,
        max_seq_len=32768,
        graph_buckets=(1, 2, 4, 8),
        flashinfer="0.7.2",
        wrappers=(WrapperUse("decode", "tc", True), WrapperUse("prefill", "fa2")),
        float_bytes=256 << 20,
    )
    assert cfg.rules == ("0.7",) and main(["workspace", "--config", str(p)]) == 0


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("[model]\nnum_heads = 4\n", "unknown key 'num_heads' in [model]"),
        ("colour = 1\n", "unknown top-level key 'colour'"),
        ("[model\n", "is not TOML"),
        ('preset = "llama3-8b-decode"\n[[wrappers]]\nwrapper = "decode"\nbackend = "xla"\n', "no backend 'xla'"),
        ("[model]\nnum_qo_heads = 8\n", "incomplete configuration"),
    ],
)
def test_toml_errors_name_the_key(tmp_path: Path, text: str, needle: str) -> None:
    p = tmp_path / "bad.toml"
    p.write_text(text)
    with pytest.raises(InvalidArgument, match=needle.replace("[", r"\[").replace("(", r"\(")):
        load_toml(p)


def test_preset_in_toml_is_overridden_by_its_keys(tmp_path: Path) -> None:
    p = tmp_path / "e.toml"
    p.write_text('preset = "llama3-8b-prefill"\n[workspace]\nfloat_bytes = 1048576\n')
    cfg = load_toml(p)
    assert cfg.num_qo_heads == 32 and cfg.float_bytes == 1 << 20 and cfg.name == "llama3-8b-prefill"


def test_workspace_package_imports_no_torch() -> None:
    import subprocess

    code = "import sys, flashcheck.workspace.oracle, flashcheck.cli.workspace_cmd; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_fc306_page_is_registered() -> None:
    from flashcheck.catalogue import get_check

    info = get_check("FC306")
    assert info.name == "workspace-size-covers-config" and info.missing_sections() == []


EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples" / "workspace").glob("*.toml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_engine_examples_are_covered(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["workspace", "--config", str(path)]) == 0
    assert "verdict: covered" in capsys.readouterr().out


def test_docs_trtllm_example_with_128_mib_is_a_witnessed_shortfall(tmp_path: Path) -> None:
    path = next(p for p in EXAMPLES if p.stem.startswith("trtllm"))
    cfg = load_toml(path).replace(float_bytes=128 << 20, flashinfer="0.6.13")
    (f,) = findings(run_oracle(cfg), tmp_path)
    assert f.severity.value == "error" and f.evidence["searched_bytes"] == 139_493_376
    assert f.evidence["witness"] == {"qo_lens": [9], "kv_lens": [4224]} and f.repro is not None
    assert Path(f.repro).name == "witness-trtllm-llama3-70b-fp8-float-0.6.json"


def test_confirm_without_a_gpu_is_exit_3(capsys: pytest.CaptureFixture[str]) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: --confirm runs (tests/gpu/test_workspace_gpu.py)")
    assert main(["workspace", "--preset", "prefill-64h-16mib", "--confirm"]) == 3
    assert "cannot run here" in capsys.readouterr().err


def test_cli_lists_presets_and_writes_the_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["workspace", "--list-presets"]) == 0
    names = capsys.readouterr().out.split()
    assert {"llama3-8b-decode", "deepseek-v3-mla-tp8", "prefill-64h-16mib", "decode-tc", "mla-fa2"} <= set(names)
    out = tmp_path / "ws.txt"
    assert main(["workspace", "--preset", "decode-tc", "--verbose", "--out", str(out)]) == 0
    text = out.read_text()
    assert "decode-tc graph bs=1 " in text and "decode-tc graph bs=32" in text and capsys.readouterr().out == ""
