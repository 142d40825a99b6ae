"""Llama models from a config: exact Llama-3.1-8B shapes and small CPU presets. Nothing distributed."""
from __future__ import annotations

import torch
import transformers.utils

# transformers imports scipy.optimize (its object-detection loss's box matcher) whenever SciPy is installed: about
# 0.3 s of CPU in every rank's start that no step here uses. Reported absent before transformers.loss is first
# imported (by LlamaForCausalLM below); train/parallel/pipeline.py takes the causal-LM loss from here for that reason.
transformers.utils.is_scipy_available = lambda: False

from transformers import AttentionInterface, LlamaConfig, LlamaForCausalLM, masking_utils
from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward
from transformers.loss.loss_utils import ForCausalLMLoss  # noqa: F401 -- the pipeline's loss, imported after the flag
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

from train.contract import presets
from train.contract.common import SpecError
from train.contract.sections import ModelSection, reject_unknown


def llama_config(model: ModelSection | dict) -> LlamaConfig:
    """A LlamaConfig from a model section: {"preset": name, **overrides} or a full set of LlamaConfig keys."""
    if isinstance(model, dict):
        model = ModelSection.from_dict(model)
    kwargs = model.llama_kwargs
    reject_unknown("model", kwargs, set(LlamaConfig().to_dict()) | {"rope_scaling", "rope_theta"})
    # no KV cache: training never decodes, and transformers' cache makes every layer's forward update it at the
    # layer's own index, so torch.compile traced one graph per layer (and ran the rest eager past its limit)
    config = LlamaConfig(**{**kwargs, "use_cache": False})
    config._attn_implementation = "sdpa"
    if config.hidden_size % config.num_attention_heads or config.num_attention_heads % config.num_key_value_heads:
        raise SpecError("model: hidden_size must divide by heads and heads by KV heads")
    return config


WHOLE_HEADS = "sdpa_whole_heads"  # transformers' attention implementation name for whole_heads_attention


class _WholeHeads:
    """What transformers' sdpa attention reads of its module, once the KV heads are repeated: one query head per
    KV head, and the module's causality."""

    num_key_value_groups = 1

    def __init__(self, is_causal: bool):
        self.is_causal = is_causal


def whole_heads_attention(module, query, key, value, attention_mask, **kwargs):
    """transformers' sdpa attention with the KV heads repeated to the query heads first. CUDA's fused kernels take
    no fp32 grouped-query attention: given `enable_gqa` in fp32, SDPA takes its math path and keeps a B x H x S x S
    score matrix per layer (about 2 GB at 8B, 2 x 2,048 tokens); with whole heads its memory-efficient kernel runs."""
    groups = getattr(module, "num_key_value_groups", 1)
    return sdpa_attention_forward(_WholeHeads(getattr(module, "is_causal", True)), query, repeat_kv(key, groups),
                                  repeat_kv(value, groups), attention_mask, **kwargs)


AttentionInterface.register(WHOLE_HEADS, whole_heads_attention)
ALL_MASK_ATTENTION_FUNCTIONS.register(WHOLE_HEADS, sdpa_mask)  # the same masks as sdpa: none when causal


def _never_packed(position_ids: torch.Tensor) -> None:
    """fedshard's sequences are never packed: every row's positions run 0 .. S-1 (train.data), so transformers' check
    for packed sequences, which reads a device value on the host at every forward without a KV cache, is skipped."""
    return None


masking_utils.find_packed_sequence_indices = _never_packed


def whole_heads(config: LlamaConfig, device: str, precision: str) -> bool:
    """Whether attention must repeat the KV heads (whole_heads_attention): fp32 grouped-query attention on CUDA."""
    return device == "cuda" and precision == "fp32" and config.num_key_value_heads < config.num_attention_heads


def for_device(config: LlamaConfig, device: str, precision: str) -> LlamaConfig:
    """`config` with the attention that never takes SDPA's math path on `device` in `precision`."""
    config._attn_implementation = WHOLE_HEADS if whole_heads(config, device, precision) else "sdpa"
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
