"""bloomserve: an SGLang-shaped runtime for ALiBi models (BLOOM, MPT, Falcon-RW) on FlashInfer.

ALiBi needs no rotary embedding, so prompts longer than the training length are admitted; past
`train_len` an optional long-context mode makes odd layers attend to the last `train_len` tokens only.
"""
