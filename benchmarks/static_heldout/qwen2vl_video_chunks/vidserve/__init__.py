"""Qwen2-VL-style video serving: host-built 3-D M-RoPE positions, ViT attention planned per video chunk."""
