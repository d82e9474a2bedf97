"""Recall and near-miss false positives of `flashcheck static` on the annotated rule fixtures.

Every ``# expect: FC10x`` line of ``tests/rules/fixtures`` is a labelled bug site and every ``# ok: FC10x`` line a
labelled near miss. A fixture is a file, or a directory checked as one project with its own ``pyproject.toml``
(hot-path configuration included). Writes ``reports/raw/static_recall.json`` and ``reports/static-recall.md``.

    PYTHONPATH=$PWD/src .venv/bin/python benchmarks/static_recall.py [--label after] [--json PATH] [--md PATH]
    git archive 4397925 src | tar -x -C /tmp/before && PYTHONPATH=/tmp/before/src .venv/bin/python \
        benchmarks/static_recall.py --label before --source-commit 4397925     # an older verifier, same fixtures

Configuration keys that the checked-out verifier does not know are dropped and listed (so an older verifier can be
measured on the same fixtures).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import platform
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import tomllib

from flashcheck.verifier import StaticConfig, check_paths

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "rules" / "fixtures"
HELDOUT = ROOT / "benchmarks" / "static_heldout"
# the held-out projects by batch (benchmarks/static_heldout/README.md): a batch estimates recall on unseen code until
# its misses guide a change of the analysis; the page says which batch was written after which change
HELDOUT_BATCHES: dict[str, tuple[str, ...]] = {
    "batch 1": ("sglang_mla", "vllm_runner"),
    "batch 2": (
        "sglang_decode_graph",
        "vllm_fi_eagle",
        "trtllm_pyexec",
        "rtpllm_fmha_moe",
        "sglang_eagle_mla",
        "vllm_mla_trtllm",
        "mini_engine",
    ),
    "batch 3": (
        "lightllm_fi_struct",
        "vllm_cascade_proto",
        "trtllm_mla_mixin",
        "sglang_async_registry",
        "sglang_multistep_draft",
    ),
    "batch 4": (
        "sglang_fi_mla_enum",
        "vllm_input_batch",
        "trtllm_graph_ctx",
        "lmdeploy_fi_graph",
    ),
    "batch 5": (
        "vllm_fi_dispatch",
        "sglang_piecewise",
        "trtllm_autodeploy",
        "spec_tree_verify",
        "disagg_overlap",
    ),
    "batch 6": (
        "fwdctx_ext_shim",
        "lora_adapter_buckets",
        "radix_prefix_offload",
        "pp_actor_microbatch",
    ),
    "batch 7": (
        "trtllm_plan_params",
        "aphrodite_v0_state",
        "medusa_lookahead",
        "chunked_sampler_graph",
    ),
    "batch 8": (
        "hybrid_mamba_attn",
        "dbo_ubatch_runner",
        "mlc_style_kvstate",
        "trtllm_eagle3_onemodel",
    ),
    "batch 9": (
        "sglang_deepseek_tbo",
        "vllm_prefix_cascade",
        "xllm_pd_disagg",
        "lmdeploy_turbomind_py",
    ),
    "batch 10": (
        "tgi_flashinfer_ctxvar",
        "rtpllm_models_py",
        "sglang_lora_cudagraph",
        "autodeploy_torch_compile",
    ),
    "batch 11": (
        "vllm_hybrid_kvgroups",
        "vlm_mrope_encoder",
        "trtllm_fp8_xqa",
        "sglang_overlap_ngram",
    ),
    "batch 12": (
        "mii_fastgen_ragged",
        "whisper_encdec_cross",
        "eagle2_dyntree",
        "kvq_fp8_pages",
    ),
    "batch 13": (
        "ktrans_cpu_experts",
        "sglang_dp_attention",
        "vllm_async_persistent",
        "spec_dual_pool",
    ),
    "batch 14": ("pld_token_pool", "streaming_sink_evict", "xpu_dual_backend"),
    "batch 15": ("embed_rerank_ragged", "qwen2vl_video_chunks"),
    "batch 16": ("pod_mixed_batch", "llama4_chunked_local", "beam_cow_blocks", "grammar_bitmask_decode"),
    "batch 17": ("gemma_softcap_window", "rl_rollout_resharding", "tp_custom_allreduce", "nbest_cascade_sampling"),
    "batch 18": ("mistral_ring_window", "cp_ring_prefill", "nvfp4_kv_decode", "diffusion_llm_denoise"),
    "batch 19": ("graph_sampler_penalties", "shared_prefix_sysprompt", "lmcache_layerwise", "mcts_reasoning_fork"),
    "batch 20": ("trtllm_bound_kvcache", "sglang_hicache_loadback", "preempt_swap_batcher", "eagle3_tree_verify"),
    "batch 21": ("qwen3next_gdn_hybrid", "deepseek_mtp_mla", "compile_plan_outside", "t5_relbias_mask"),
    "batch 22": ("snapkv_evict", "quest_block_sparse", "persistent_batch_attention", "early_exit_layers"),
    "batch 23": ("tenant_quota_prefix", "draft_stream_overlap", "gptoss_attention_sinks", "embed_generate_mixed"),
    "batch 24": ("ulysses_sp_serve", "vllm_multistep_advance", "cacheblend_rag_reuse", "llumnix_live_migration"),
    "batch 25": ("recompute_preempt_prefix", "warmup_flag_guards", "cfg_guidance_pairs", "duo_head_split"),
    "batch 26": ("multimodel_graph_pools", "prm_step_scores", "infllm_hot_pages", "longrope_dual_factor"),
    "batch 27": ("mod_depth_router", "offline_static_buckets", "desktop_seqlen_graphs", "layer_backend_plugins"),
    "batch 28": ("dca_dual_chunk", "yoco_shared_kv", "moshi_duplex_depth", "slo_abort_scheduler"),
    "batch 29": ("diff_attn_pairs", "batch_invariant_serve", "semi_pd_sm_split", "afd_pingpong"),
    "batch 30": ("npc_session_pins", "knnlm_datastore", "alibi_bloom_serve", "watermark_sampler"),
    "batch 31": ("contrastive_amateur", "retro_chunk_xattn", "fim_repo_completion", "loglik_eval_scorer"),
    "batch 32": ("suffix_spec_decode", "prefix_tuning_pins", "vla_action_chunks", "bigbird_global_window"),
    "batch 33": (
        "ssm_hybrid_jamba_serve",
        "kv_quant_int4_pages",
        "multi_tenant_router_colo",
        "agentic_tool_loop_resume",
    ),
    "batch 34": ("lookahead_jacobi_ngram", "sparse_moe_ep_a2a", "streaming_asr_xattn", "kv_compress_h2o_evict"),
    "batch 35": (
        "structured_json_fsm_serve",
        "mixed_lora_rank_sgmv",
        "edge_int8_bucket_serve",
        "cross_dc_kv_rdma_pool",
    ),
    "batch 36": (
        "sarathi_chunked_piggyback",
        "paged_vlm_mrope_cache",
        "rl_sampler_grpo_rollout",
        "hetero_gpu_split_serve",
    ),
    "batch 37": (
        "spec_mtp_chain_depthgraphs",
        "kv_offload_nvme_tiers",
        "tp_pp_hybrid_stages",
        "long_doc_qa_cascade",
    ),
    "batch 38": (
        "pd_router_kvx_transfer",
        "moe_tp_mla_absorb",
        "batch_api_offline_static",
        "beam_search_fork_cow",
    ),
    "batch 39": (
        "sliding_kv_ring_serve",
        "reward_model_batch_scorer",
        "quant_switch_kv_server",
        "sp_ulysses_a2a_attn",
    ),
    "batch 40": (
        "kv_defrag_compactor",
        "slora_unified_paging",
        "fid_rag_cross_fusion",
        "bucket_autotune_recapture",
    ),
    "batch 41": (
        "cla_cross_layer_kvshare",
        "yarn_rope_context_ext",
        "token_healing_constrained",
        "elastic_tp_rescale",
    ),
    "batch 42": (
        "expert_offload_lru_prefetch",
        "async_detok_output_overlap",
        "batch_reorder_permuted_graphs",
        "prefix_tree_refcount_gc",
    ),
    "batch 43": (
        "logits_processor_plugins",
        "kv_restore_warm_restart",
        "fp8_online_kv_calibration",
        "vocab_parallel_sampler",
    ),
    "batch 44": (
        "prompt_adapter_soft_tokens",
        "epd_three_stage_disagg",
        "two_level_speculative_drafts",
        "token_budget_mixed_scheduler",
    ),
    "batch 45": (
        "moe_shared_expert_side_stream",
        "small_large_model_cascade",
        "priority_page_reservation",
        "cpu_offload_decode_attention",
    ),
    "batch 46": (
        "shared_helpers_host_mirrors",
        "dual_graph_pools_decode_verify",
        "async_engine_step_futures",
        "kv_layout_nhd_hnd_convert",
    ),
    "batch 47": (
        "multi_lora_graph_slots",
        "chunked_vocab_logits_sampling",
        "hybrid_swa_full_layers",
        "request_migration_between_gpus",
    ),
    "batch 48": (
        "dsa_topk_sparse_indexer",
        "seeded_sampling_graphs",
        "step_metrics_recorder",
        "jump_forward_structured_decode",
    ),
    "batch 49": (
        "device_resident_scheduler",
        "per_head_window_spans",
        "custom_op_attention_compile",
        "token_granular_radix_pool",
    ),
    "batch 50": (
        "kv_connector_layerwise_hooks",
        "decode_context_parallel_lse_merge",
        "per_layer_group_head_dims",
        "attention_backend_fallback_chain",
    ),
    "batch 51": (
        "memory_profiler_kv_sizing",
        "graph_capture_mempool_largest_first",
        "eplb_expert_rebalance",
        "mooncake_kv_store_hooks",
    ),
    "batch 52": (
        "prefix_sharing_fork_join_agents",
        "fp8_kv_scales_per_head_dispatch",
        "async_output_processing_pipeline",
        "chunked_prefill_decode_interleave_graphs",
    ),
    "batch 53": (
        "pipeline_parallel_microbatch_graphs",
        "speculative_tree_draft_budget",
        "vision_prefix_cache_reuse",
        "sampler_graph_with_penalties_and_grammar",
    ),
    "batch 54": (
        "lora_hot_swap_graph_rebind",
        "sliding_window_ring_pages",
        "multi_tenant_qos_scheduler",
        "mla_absorbed_decode_runner",
    ),
    "batch 55": (
        "beam_width_adaptive_decode",
        "kv_cache_compression_quant_tiers",
        "streaming_tts_codec_decoder",
        "serverless_cold_start_warmup",
    ),
    "batch 56": (
        "minference_vertical_slash_prefill",
        "prompt_logprobs_chunked",
        "cuda_ipc_kv_frontend_workers",
        "kv_event_router_publisher",
    ),
    "batch 57": (
        "ntk_rope_per_request_scaling",
        "long_prefill_kv_split_merge",
        "multi_stream_prefill_decode_overlap",
        "nvml_telemetry_watchdog",
    ),
    "batch 58": (
        "async_double_buffer_page_tables",
        "speculative_rollback_kv_truncate",
        "deterministic_replay_step_logger",
        "elastic_kv_pool_resize",
    ),
    "batch 59": (
        "vision_tower_bucket_graphs",
        "flashinfer_sampling_graph",
        "warm_standby_replica_sync",
        "kv_aware_request_batcher",
    ),
    "batch 60": (
        "awq_marlin_quantized_serving",
        "multi_node_tp_kv_indices_allgather",
        "reasoning_budget_scheduler",
        "request_tracing_profiler_hooks",
    ),
    "batch 61": (
        "byte_level_patch_decoder",
        "kv_integrity_checksum_scanner",
        "draft_target_split_gpus",
        "grammar_constrained_json_mode",
    ),
    "batch 62": (
        "star_attention_long_context",
        "razor_retrieval_head_pruning",
        "omni_thinker_talker",
        "weight_streaming_offload_decode",
    ),
    "batch 63": (
        "async_sched_placeholder_tokens",
        "conversation_tree_branching",
        "streaming_video_frame_evict",
        "online_draft_distillation",
    ),
    "batch 64": (
        "prefix_cache_hash_chain_blocks",
        "dp_attention_moe_padding",
        "fp8_mla_per_token_scales",
        "tool_call_parser_streaming",
    ),
    "batch 65": (
        "sparse_attention_token_selection",
        "multi_adapter_vision_language_router",
        "kv_transfer_rdma_disaggregated",
        "sampler_logprob_topn_graphs",
    ),
    "batch 66": (
        "cuda_graph_trees_compile_serving",
        "longcontext_chunked_kv_offload_prefetch",
        "batch_invariant_kernels_eval",
        "ray_actor_pipeline_stages",
    ),
    "batch 67": (
        "gemma3_local_global_page_sizes",
        "request_cancellation_abort_paths",
        "embedding_cache_prompt_lookup",
        "nvshmem_moe_dispatch_combine",
    ),
    "batch 68": (
        "inline_capture_decode_engine",
        "metadata_prepare_planner_backend",
        "multi_query_group_prefill_server",
        "spec_decode_token_tree_masks",
    ),
    "batch 69": (
        "quantized_kv_fp4_dequant_decode",
        "cpu_gpu_hybrid_attention_split",
        "serving_metrics_slo_autoscaler",
        "encoder_decoder_t5_cross_cache",
    ),
    "batch 70": (
        "union_typed_backend_registry",
        "prefill_decode_colocated_streams",
        "kv_cache_prefix_hash_radix_sglang",
        "moe_expert_load_monitor",
    ),
    "batch 71": (
        "chunked_prefill_budget_planner",
        "logits_soft_cap_sliding_window_models",
        "pinned_staging_ring_buffers",
        "draft_model_free_lookahead",
    ),
}
_ANNOTATION = re.compile(r"#\s*(expect|ok):\s*(FC\d{3}(?:\s*,\s*FC\d{3})*)")


def marks(path: Path) -> dict[str, set[tuple[str, int]]]:
    """{"expect"|"ok": {(rule ID, line)}} of one file."""
    out: dict[str, set[tuple[str, int]]] = {"expect": set(), "ok": set()}
    for lineno, line in enumerate(path.read_text().splitlines(), start=1):
        for kind, ids in _ANNOTATION.findall(line):
            for rule_id in re.split(r"\s*,\s*", ids):
                out[kind].add((rule_id, lineno))
    return out


def fixture_config(target: Path) -> tuple[StaticConfig, list[str]]:
    base = target if target.is_dir() else target.parent
    known = {f.name for f in dataclasses.fields(StaticConfig)}
    values: dict[str, Any] = {"root": str(base)}
    dropped: list[str] = []
    pyproject = base / "pyproject.toml"
    if target.is_dir() and pyproject.is_file():
        table = tomllib.loads(pyproject.read_text())["tool"]["flashcheck"]["static"]
        for key, value in table.items():
            name = key.replace("-", "_")
            if name in known:
                values[name] = tuple(value) if isinstance(value, list) else value
            else:
                dropped.append(key)
    return StaticConfig(**values), dropped


def measure(target: Path) -> dict[str, Any]:
    config, dropped = fixture_config(target)
    result = check_paths([str(target)], config)
    base = target if target.is_dir() else target.parent
    files = sorted(target.rglob("*.py")) if target.is_dir() else [target]
    fired = {(f.location.file, f.id, f.location.line) for f in result.findings}
    per_rule: dict[str, dict[str, int]] = defaultdict(lambda: {"expect": 0, "hit": 0, "ok": 0, "false_positive": 0})
    missed: list[str] = []
    noisy: list[str] = []
    for path in files:
        rel = path.relative_to(base).as_posix()
        m = marks(path)
        for rule_id, line in sorted(m["expect"]):
            per_rule[rule_id]["expect"] += 1
            if (rel, rule_id, line) in fired:
                per_rule[rule_id]["hit"] += 1
            else:
                missed.append(f"{rel}:{line} {rule_id}")
        for rule_id, line in sorted(m["ok"]):
            per_rule[rule_id]["ok"] += 1
            if (rel, rule_id, line) in fired:
                per_rule[rule_id]["false_positive"] += 1
                noisy.append(f"{rel}:{line} {rule_id}")
    return {
        "fixture": target.relative_to(HELDOUT.parent if HELDOUT in target.parents else FIXTURES).as_posix(),
        "per_rule": dict(per_rule),
        "missed": missed,
        "false_positives": noisy,
        "dropped_config_keys": dropped,
        "internal_errors": result.internal_errors,
    }


def _batch_totals(run: dict[str, Any], batch: str) -> dict[str, Any] | None:
    """`totals` over the held-out projects of `batch` in `run` (None when the run has none of them)."""
    rows = [r for r in run["fixtures"] if r["fixture"].removeprefix("static_heldout/") in HELDOUT_BATCHES[batch]]
    return totals(rows) if rows else None


def _blind_summary(doc: dict[str, Any]) -> str:
    """``batch 2 51/54, 0/53; ...`` from each `blind (batch N unseen)` run, for its own batch."""
    parts = []
    for batch in HELDOUT_BATCHES:
        run = doc["runs"].get(f"blind ({batch} unseen)")
        t = _batch_totals(run, batch) if run else None
        if t is not None:
            parts.append(f"{batch} {t['hit']}/{t['expect']}, {t['false_positive']}/{t['ok']}")
    return "; ".join(parts) or "none yet"


def totals(rows: list[dict[str, Any]]) -> dict[str, Any]:
    expect = sum(v["expect"] for r in rows for v in r["per_rule"].values())
    hit = sum(v["hit"] for r in rows for v in r["per_rule"].values())
    ok = sum(v["ok"] for r in rows for v in r["per_rule"].values())
    fp = sum(v["false_positive"] for r in rows for v in r["per_rule"].values())
    return {
        "expect": expect,
        "hit": hit,
        "recall": round(hit / expect, 4) if expect else None,
        "ok": ok,
        "false_positive": fp,
        "near_miss_fp_rate": round(fp / ok, 4) if ok else None,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--label", default="current", help="name of this measurement in the JSON (before/after)")
    ap.add_argument(
        "--source-commit",
        default=None,
        help="the commit whose src/ is on PYTHONPATH, when it is not this checkout's HEAD (e.g. an older verifier "
        "unpacked with `git archive REV src`)",
    )
    ap.add_argument("--json", default=str(ROOT / "reports" / "raw" / "static_recall.json"))
    ap.add_argument("--md", default=str(ROOT / "reports" / "static-recall.md"))
    args = ap.parse_args(argv)
    targets = sorted(
        p for p in FIXTURES.iterdir() if p.suffix == ".py" or (p.is_dir() and p.name.startswith("engine_"))
    )
    targets += sorted(p for p in HELDOUT.iterdir() if p.is_dir())
    rows = [measure(t) for t in targets]
    engine = [r for r in rows if r["fixture"].startswith("engine_")]
    heldout = [r for r in rows if r["fixture"].startswith("static_heldout/")]
    rows = [r for r in rows if r not in heldout]
    git = ["git", "rev-parse", "--short", args.source_commit or "HEAD"]
    rev = subprocess.run(git, check=False, cwd=ROOT, capture_output=True, text=True).stdout
    run = {
        "label": args.label,
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "commit": rev.strip(),
        "engine_fixtures": totals(engine),
        "all_fixtures": totals(rows),
        "heldout": totals(heldout),
        "fixtures": rows + heldout,
    }
    path = Path(args.json)
    doc: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {"runs": {}}
    doc["runs"][args.label] = run
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n")
    Path(args.md).write_text(render(doc))
    e = run["engine_fixtures"]
    h = run["heldout"]
    print(f"{args.label}: engine recall {e['hit']}/{e['expect']}, near-miss FP {e['false_positive']}/{e['ok']}")
    print(f"{args.label}: held-out recall {h['hit']}/{h['expect']}, near-miss FP {h['false_positive']}/{h['ok']}")
    return 0


def _pct(n: int, d: int) -> str:
    return f"{n}/{d} ({100 * n / d:.1f}%)" if d else "-"


def render(doc: dict[str, Any]) -> str:
    lines = [
        "# `flashcheck static` recall and near-miss false positives on the annotated fixtures",
        "",
        "Generated by `benchmarks/static_recall.py` from `reports/raw/static_recall.json`. A bug site is a",
        "`# expect: FC10x` line, a near miss an `# ok: FC10x` line of `tests/rules/fixtures`; the engine fixtures",
        "(`engine_*/`, SGLang-, vLLM-, TensorRT-LLM- and rtp-llm-shaped projects with their own hot-path",
        "configuration) are counted apart from the per-rule fixtures. The engine fixtures were written together with",
        "the analysis they measure. The held-out samples (`benchmarks/static_heldout/`) are written in batches after",
        "the analysis, by someone who reads the rule pages but not the analysis; a batch measures recall on unseen",
        "code until its misses guide a change. Each batch from 2 on was measured blind, in the run `blind (batch N",
        "unseen)`, before its misses guided the fixes that followed (one label of batch 4 was corrected after its",
        "writer saw the output: a line that read no data, marked as a sync; no other label was corrected). Each",
        "batch on its own in its blind run (recall, near-miss false positives): " + _blind_summary(doc) + "; the",
        "last is the latest estimate for code the analysis has not seen.",
        "Every run is measured over every batch, so a row shows what a later batch would have found at that commit.",
        "",
        "| run | date | commit | engine recall | engine near-miss FP | held-out recall | held-out near-miss FP "
        "| all fixtures recall | all fixtures near-miss FP |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for label, run in doc["runs"].items():
        e, a = run["engine_fixtures"], run["all_fixtures"]
        h = run.get("heldout") or {"hit": 0, "expect": 0, "false_positive": 0, "ok": 0}
        lines.append(
            f"| {label} | {run['date']} | {run['commit']} | {_pct(e['hit'], e['expect'])} | "
            f"{_pct(e['false_positive'], e['ok'])} | {_pct(h['hit'], h['expect'])} | "
            f"{_pct(h['false_positive'], h['ok'])} | {_pct(a['hit'], a['expect'])} | "
            f"{_pct(a['false_positive'], a['ok'])} |"
        )
    lines += ["", "Held-out samples by batch (recall, near-miss false positives):", ""]
    lines += ["| run | " + " | ".join(HELDOUT_BATCHES) + " |", "|---|" + "---|" * len(HELDOUT_BATCHES)]
    for label, run in doc["runs"].items():
        cells = []
        for batch in HELDOUT_BATCHES:
            t = _batch_totals(run, batch)
            cells.append(f"{_pct(t['hit'], t['expect'])}, {_pct(t['false_positive'], t['ok'])}" if t else "-")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    for label, run in doc["runs"].items():
        lines += ["", f"## {label}: `{run['command']}` (Python {run['python']})", ""]
        lines += ["| fixture | rule | bug sites found | near misses flagged |", "|---|---|---|---|"]
        for r in run["fixtures"]:
            for rule_id, v in sorted(r["per_rule"].items()):
                lines.append(
                    f"| {r['fixture']} | {rule_id} | {v['hit']}/{v['expect']} | {v['false_positive']}/{v['ok']} |"
                )
        missed = [f"{r['fixture']}/{m}" for r in run["fixtures"] for m in r["missed"]]
        noisy = [f"{r['fixture']}/{m}" for r in run["fixtures"] for m in r["false_positives"]]
        dropped = sorted({k for r in run["fixtures"] for k in r["dropped_config_keys"]})
        lines += ["", f"Missed bug sites ({len(missed)}): " + (", ".join(f"`{m}`" for m in missed) or "none")]
        lines += ["", f"Flagged near misses ({len(noisy)}): " + (", ".join(f"`{m}`" for m in noisy) or "none")]
        if dropped:
            lines += ["", "Configuration keys this verifier does not know (dropped): " + ", ".join(dropped)]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
