"""paged_vlm: a multi-turn vision-language server (Qwen2-VL-shaped) over FlashInfer paged attention."""
