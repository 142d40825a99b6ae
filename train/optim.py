"""AdamW with linear warm-up then cosine decay: the paper authors' defaults, all configurable."""
from __future__ import annotations

import math

import torch

from train.config import TrainConfig


def adamw(params, cfg: TrainConfig) -> torch.optim.AdamW:
    return torch.optim.AdamW(params, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, weight_decay=cfg.weight_decay)


def lr_factor(step: int, cfg: TrainConfig) -> float:
    """Multiplier of cfg.lr for optimizer step `step` (0-based)."""
    warmup = round(cfg.warmup_frac * cfg.steps)
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, cfg.steps - warmup))
    return cfg.min_lr_frac + (1 - cfg.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * progress))


def schedule(optimizer: torch.optim.Optimizer, cfg: TrainConfig) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, cfg))
