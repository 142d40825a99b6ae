"""Llama models from a config: exact Llama-3.1-8B shapes and small CPU presets. Nothing distributed."""
from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from train.contract import presets
from train.contract.common import SpecError
from train.contract.sections import ModelSection, reject_unknown


def llama_config(model: ModelSection | dict) -> LlamaConfig:
    """A LlamaConfig from a model section: {"preset": name, **overrides} or a full set of LlamaConfig keys."""
    if isinstance(model, dict):
        model = ModelSection.from_dict(model)
    kwargs = model.llama_kwargs
    reject_unknown("model", kwargs, set(LlamaConfig().to_dict()) | {"rope_scaling", "rope_theta"})
    config = LlamaConfig(**kwargs)
    config._attn_implementation = "sdpa"
    if config.hidden_size % config.num_attention_heads or config.num_attention_heads % config.num_key_value_heads:
        raise SpecError("model: hidden_size must divide by heads and heads by KV heads")
    return config


def build(config: LlamaConfig, device: str | torch.device = "cpu") -> LlamaForCausalLM:
    """Construct on `device`; on "meta" nothing is allocated (used for the 8B shapes)."""
    with torch.device(device):
        return LlamaForCausalLM(config)


def count_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def flops_per_token(config: LlamaConfig, n_params: int, seq_len: int) -> float:
    """Training FLOPs per token of this model (presets.flops_per_token)."""
    return presets.flops_per_token(config.vocab_size, config.hidden_size, config.num_hidden_layers, n_params,
                                   seq_len)
