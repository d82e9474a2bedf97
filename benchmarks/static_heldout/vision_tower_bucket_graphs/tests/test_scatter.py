import torch

from vlm.scatter import scatter_image_embeds


def test_scatter_places_rows_in_order():
    embeds = torch.zeros(8, 4)
    image = torch.arange(12, dtype=torch.float32).view(3, 4)
    pos = torch.tensor([1, 2, 5])
    out = scatter_image_embeds(embeds, image, pos)
    assert torch.equal(out[pos], image)  # ok: FC109
    assert out[0].abs().sum() == 0
