"""Image embeddings into the prompt's token embeddings."""

import torch


def image_token_positions(input_ids: torch.Tensor, image_token_id: int) -> torch.Tensor:
    """Positions of the image placeholder tokens, in prompt order."""
    idx = torch.arange(input_ids.numel(), device=input_ids.device)
    return idx[input_ids == image_token_id]  # expect: FC101


def scatter_image_embeds(
    inputs_embeds: torch.Tensor, image_embeds: torch.Tensor, positions: torch.Tensor
) -> torch.Tensor:
    """Writes one merged vision embedding per placeholder token, in place."""
    assert image_embeds.shape[0] == positions.shape[0], "one embedding per placeholder"  # expect: FC109
    inputs_embeds.index_copy_(0, positions, image_embeds.to(inputs_embeds.dtype))
    return inputs_embeds
