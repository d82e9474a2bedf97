"""Mixed prefill/decode serving over FlashInfer's persistent BatchAttention."""
