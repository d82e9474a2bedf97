"""Built-in configuration tables of the nctllm engine.

Everything here is plain data.  ``nct_cfg.loader.load_config`` deep-copies
``DEFAULT_CONFIG``, merges the JSON file given on the command line into it, then
the per-model table ``MODEL_OVERRIDES`` and finally ``NCT_*`` environment
variables.  Components read their section as ``cfg["attention"]`` and pass
options down as ``**cfg["decode"]``.
"""

ENV_PREFIX = "NCT_"

DEFAULT_CONFIG = {
    "model": "llama-3-8b",
    "backend": "fa2",
    "dtype": "bfloat16",
    "model_dims": {
        "num_layers": 32,
        "hidden_size": 4096,
        "num_qo_heads": 32,
        "num_kv_heads": 8,
        "head_dim": 128,
        "vocab_size": 128256,
    },
    "attention": {
        "page_size": 16,
        "kv_layout": "NHD",
        "kv_dtype": "bfloat16",
        "workspace_mb": 128,
        "prefill_backend": "fa2",
        "decode_backend": "fa2",
        "sliding_window": -1,
        "window_layers": [],
        "shared_prefix_pages": 0,
        "use_tensor_cores": True,
    },
    "decode": {
        "use_tensor_cores": True,
        "check_inputs": False,
        "pos_encoding_mode": "NONE",
    },
    "prefill": {
        "causal": True,
        "pos_encoding_mode": "NONE",
        "max_num_tokens": 8192,
    },
    "cuda_graph": {
        "enabled": True,
        "batch_sizes": [1, 2, 4, 8, 16, 32, 64],
        "pad_last_page": True,
    },
    "trtllm": {
        "workspace_mb": 256,
        "zero_workspace": True,
        "max_seq_len": 32768,
    },
    "speculative": {"num_mtp_layers": 0},
    "hot_path": {
        "log_lengths": False,
        "return_logprobs": False,
    },
    "scheduler": {
        "max_batch_size": 64,
        "max_num_tokens": 8192,
        "max_num_reqs": 256,
    },
    "kv_cache": {"num_pages": 32768, "defrag_every": 0, "max_pages_per_req": 2048},
    "sampling": {"temperature": 1.0, "eos_token_id": 2, "stop_token_ids": []},
}

# Per-model overrides, merged over the defaults and the JSON file by load_config.
MODEL_OVERRIDES = {
    "llama-3.1-70b-fp8": {
        "backend": "trtllm-gen",
        "model_dims": {"num_layers": 80, "hidden_size": 8192, "num_qo_heads": 64},
        "attention": {"kv_dtype": "fp8_e4m3", "decode_backend": "trtllm-gen", "workspace_mb": 512},
        "trtllm": {"workspace_mb": 512},
    },
    "qwen2-7b": {"attention": {"sliding_window": 4096, "window_layers": list(range(0, 28, 2))}},
    "mistral-7b": {"attention": {"sliding_window": 4096, "page_size": 32}},
    "deepseek-v3-mtp": {"speculative": {"num_mtp_layers": 1}},
}

# Workspace tier per backend family, in MiB.  Nothing writes this table after import.
WORKSPACE_TIERS_MB = {"fa2": 128, "trtllm-gen": 256, "xqa": 64}

# Workspace per wrapper kind, in MiB.  NCT_WS_<KIND>_MB overrides these at start-up
# (nct_cfg.loader.apply_env_overrides updates the table in place).
WORKSPACE_MB = {"decode": 128, "prefill": 256, "draft": 64}

assert isinstance(DEFAULT_CONFIG["attention"]["page_size"], int)  # ok: FC109
