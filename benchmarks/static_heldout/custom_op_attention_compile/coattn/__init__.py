"""Attention as a torch.library custom op: the compiled model sees one opaque op per layer;
the op looks its FlashInfer wrappers up in the forward context that the runner sets after
planning outside the compiled region."""
