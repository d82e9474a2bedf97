"""longrope: serving Phi-3-style LongRoPE models.

Positions up to `original_max_position_embeddings` use the short rescale
factors; once a request passes that length the batch switches to the long
factors, and the request's KV written with the short factors is recomputed.
"""
