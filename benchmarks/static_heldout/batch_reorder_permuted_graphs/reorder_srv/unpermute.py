import torch


class OutputUnpermuter:
    """Maps the sorted batch's outputs back to request order after the replay."""

    def __init__(self, backend, max_batch, device):
        self.backend = backend
        self.device = device
        self.inv_perm_dev = torch.arange(max_batch, dtype=torch.int64, device=device)
        self.arange_dev = torch.arange(max_batch, dtype=torch.int64, device=device)

    def unpermute(self, sorted_logits, bs):
        perm = self.backend.perm_dev[:bs]
        self.inv_perm_dev = torch.empty_like(self.backend.perm_dev)  # expect: FC107
        self.inv_perm_dev[:bs].scatter_(0, perm, self.arange_dev[:bs])
        if not torch.equal(self.inv_perm_dev[:bs][perm], self.arange_dev[:bs]):  # expect: FC101
            raise RuntimeError("batch permutation is not a bijection")
        # the next step appends tokens in request order: put the last-page lengths back in that order
        lp = self.backend.kv_last_page_len[:bs]
        lp.copy_(lp[self.inv_perm_dev[:bs]])  # expect: FC104
        return sorted_logits.index_select(0, self.inv_perm_dev[:bs])
