"""autograd Functions (attention_fn), torch.library custom ops (custom_ops) and the wrapper registry."""
