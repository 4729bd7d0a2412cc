"""NoPE: no position transform at all (Kazemnejad et al., 2023). Causal masking is the only order signal."""

from accrot.position.base import RotationPart
from accrot.position.scheme import register_rotation


@register_rotation("none")
class NoRotation(RotationPart):
    kind = "none"
