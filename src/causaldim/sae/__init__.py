"""Sparse autoencoders: one module per architecture, a registry, and file formats."""

from .base import SAE, SAEConfig
from .jumprelu import JumpReLUSAE
from .relu import ReLUSAE
from .topk import TopKSAE

ARCHITECTURES: dict[str, type[SAE]] = {
    cls.architecture: cls for cls in (TopKSAE, JumpReLUSAE, ReLUSAE)
}


def build(cfg: SAEConfig) -> SAE:
    return ARCHITECTURES[cfg.architecture](cfg)


__all__ = ["SAE", "SAEConfig", "ARCHITECTURES", "build", "TopKSAE", "JumpReLUSAE", "ReLUSAE"]
