"""AdamW with linear warm-up then cosine decay: the paper authors' defaults, all configurable."""
from __future__ import annotations

import math

import torch

from train.contract.config import TrainConfig


def adamw(params, cfg: TrainConfig, fused: bool = False) -> torch.optim.AdamW:
    """`fused`: one kernel per parameter group with its step counters kept on the device (no host scalar read
    per step); the trainer asks for it on CUDA, where torch fuses AdamW over FSDP2's DTensor parameters as
    torchtitan does. Otherwise torch's default (foreach on CUDA, one tensor at a time on CPU), which every CPU
    parity test and committed CPU result ran."""
    return torch.optim.AdamW(params, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, weight_decay=cfg.weight_decay,
                             fused=fused or None)


def lr_factor(step: int, cfg: TrainConfig) -> float:
    """Multiplier of cfg.lr for optimizer step `step` (0-based)."""
    warmup = round(cfg.warmup_frac * cfg.steps)
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, cfg.steps - warmup))
    return cfg.min_lr_frac + (1 - cfg.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * progress))


def schedule(optimizer: torch.optim.Optimizer, cfg: TrainConfig) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, cfg))
