"""ptserve: serve many prefix-tuned tenants from one base model.

Each tenant brings a learned soft prompt (prefix tuning: per-layer keys and values for a
few dozen virtual tokens).  The soft prompts are written once into KV pages that the page
allocator never evicts, and every step attends to them through a separate FlashInfer
prefill whose output is merged with the request's own attention.
"""
