"""Loads AWQ checkpoints and repacks them for the Marlin GEMM."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Dict, Mapping, Optional

import torch

from awq.config import AWQServeConfig, QuantLayerMeta

logger = logging.getLogger(__name__)

AWQ_PACK_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


@dataclass
class MarlinWeights:
    qweight: torch.Tensor
    scales: torch.Tensor
    qzeros: Optional[torch.Tensor]
    meta: QuantLayerMeta


def repack_awq_to_marlin(qweight: torch.Tensor, meta: QuantLayerMeta) -> torch.Tensor:
    order = torch.tensor(AWQ_PACK_ORDER, device=qweight.device)
    shifts = order * 4
    unpacked = (qweight.unsqueeze(-1) >> shifts) & 0xF
    tile_k, tile_n = meta.marlin_tile
    unpacked = unpacked.reshape(meta.in_features // tile_k, tile_k, -1)
    return torch.ops._C.awq_marlin_repack(unpacked.contiguous(), meta.in_features, meta.out_features, 4)


class AWQWeightLoader:
    PACK_FACTOR = 8

    def __init__(self, cfg: AWQServeConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.layers: Dict[str, MarlinWeights] = {}
        self.metas: Dict[str, QuantLayerMeta] = {}
        self._packed: Optional[int] = None

    def load_checkpoint(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        for key in sorted(state_dict):
            if not key.endswith(".qweight"):
                continue
            prefix = key[: -len(".qweight")]
            self.load_layer(
                prefix,
                state_dict[key],
                state_dict.get(prefix + ".qzeros"),
                state_dict[prefix + ".scales"],
                self.cfg.group_size,
            )
        self._packed = len(self.layers)
        logger.info("loaded %d AWQ layers", self._packed)

    def load_layer(self, name: str, qweight: torch.Tensor, qzeros: Optional[torch.Tensor],
                   scales: torch.Tensor, group_size: int) -> QuantLayerMeta:
        assert qweight.dtype == torch.int32, "AWQ qweight must be int32-packed"  # expect: FC109
        in_features = qweight.shape[0]
        out_features = qweight.shape[1] * self.PACK_FACTOR
        if scales.shape[0] * group_size != in_features:
            raise ValueError(f"{name}: {scales.shape[0]} groups of {group_size} != {in_features} inputs")
        meta = QuantLayerMeta(name=name, in_features=in_features, out_features=out_features,
                              group_size=group_size, zero_point=qzeros is not None)
        packed = repack_awq_to_marlin(qweight.to(self.device), meta)
        zeros = qzeros.to(self.device) if qzeros is not None else None
        self.layers[name] = MarlinWeights(packed, scales.to(self.device, dtype=torch.float16), zeros, meta)
        self.metas[name] = meta
        return meta

    def _check_packed(self) -> None:
        assert self._packed is not None, "load_checkpoint() has not run"  # ok: FC109

    def weights(self, name: str) -> MarlinWeights:
        self._check_packed()
        return self.layers[name]
