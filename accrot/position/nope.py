"""NoPE: no position transform at all (Kazemnejad et al., 2023). Causal masking is the only order signal."""

import torch

from accrot.position.base import RotationPart
from accrot.position.scheme import register_rotation


@register_rotation("none")
class NoRotation(RotationPart):
    kind = "none"

    def predicted_coherence(self, distances: torch.Tensor) -> torch.Tensor:
        return torch.ones(distances.shape[0], dtype=torch.float64)  # M_{t,s} = I: nothing to lose

    def prediction_basis(self) -> str:
        return "exact"
