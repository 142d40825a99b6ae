"""Llama models from a config: exact Llama-3.1-8B shapes and small CPU presets. Nothing distributed."""
from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from .errors import SpecError

def llama3_rope(original_max: int) -> dict:
    """Llama-3.1's RoPE scaling (factor 8) around an original context of `original_max` tokens."""
    return {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": original_max}

PRESETS: dict[str, dict] = {
    # Llama-3.1-8B: 8,030,261,248 parameters.
    "llama3_8b": dict(vocab_size=128256, hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=8, intermediate_size=14336, max_position_embeddings=131072,
                      rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False, rope_scaling=llama3_rope(8192)),
    # Tests: a few ms per step on CPU.
    "tiny": dict(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=128, max_position_embeddings=2048, rope_theta=500000.0, rms_norm_eps=1e-5,
                 tie_word_embeddings=False, rope_scaling=llama3_rope(256)),
    # Local sweeps: ~5 M parameters (20 MB fp32), so communication is visible next to compute.
    "small": dict(vocab_size=4096, hidden_size=256, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
                  intermediate_size=704, max_position_embeddings=4096, rope_theta=500000.0, rms_norm_eps=1e-5,
                  tie_word_embeddings=False, rope_scaling=llama3_rope(512)),
}


def llama_config(model: dict) -> LlamaConfig:
    """A LlamaConfig from {"preset": name, **overrides} or a full set of LlamaConfig keys."""
    model = dict(model)
    preset = model.pop("preset", None)
    if preset is not None and preset not in PRESETS:
        raise SpecError(f"unknown model preset {preset!r}; expected one of {', '.join(PRESETS)}")
    kwargs = {**PRESETS.get(preset, {}), **model}
    known = set(LlamaConfig().to_dict()) | {"rope_scaling", "rope_theta"}
    unknown = sorted(set(kwargs) - known)
    if unknown:
        raise SpecError(f"unknown model key(s): {', '.join(unknown)}")
    if "hidden_size" not in kwargs:
        raise SpecError("model needs a preset or explicit shapes (hidden_size, num_hidden_layers, ...)")
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
    """Training FLOPs per token: 6 per matmul weight (embedding lookup excluded) plus attention scores."""
    matmul_params = n_params - config.vocab_size * config.hidden_size
    return 6 * matmul_params + 12 * config.num_hidden_layers * config.hidden_size * seq_len
