"""float8 training (train.float8): the decoder layers' matmuls through torchao's Float8Linear, dynamic tensorwise
scaling, converted before the model is split and sharded, as torchtitan converts Llama. lm_head stays in the
compute dtype (its output is the logits the loss reads; torchtitan leaves it out too), and so does any matrix
whose sides do not divide by 16 (fp8 matmuls need them to).

Only GPUs whose tensor cores compute fp8 (compute capability 8.9: Ada, Hopper, Blackwell) gain from it; anywhere
else the run is refused in one line before it trains (the launcher refuses it before submitting where the
cluster says its GPUs have no fp8, cluster.fp8)."""
from __future__ import annotations

import torch

FP8_CAPABILITY = (8, 9)


def why_not(device: str, tp: int) -> str | None:
    """Why float8 training cannot run here, or None where it can."""
    if device != "cuda":
        return (f"train.float8=true needs a GPU with fp8 tensor cores (H100, H200, B200); this run's device is "
                f"{device}")
    capability = torch.cuda.get_device_capability()
    if capability < FP8_CAPABILITY:
        return (f"train.float8=true needs fp8 tensor cores (compute capability 8.9 or later: H100, H200, B200); "
                f"{torch.cuda.get_device_name()} has {capability[0]}.{capability[1]}")
    if tp > 1:
        return "train.float8=true with train.tp > 1 is not supported: tensor parallelism splits nn.Linear only"
    try:
        import torchao.float8  # noqa: F401
    except ImportError:
        return "train.float8=true needs torchao: pip install 'fedshard[float8]'"
    return None


def convert(model: torch.nn.Module, all_gather: bool = False, emulate: bool = False) -> None:
    """Swap the decoder layers' nn.Linear for torchao's Float8Linear (module docstring), in place; `all_gather`:
    FSDP gathers their weights in float8 (train.float8_all_gather); `emulate`: float8 arithmetic without fp8
    hardware (the dry-run plays a CUDA run's memory on CPU)."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    def eligible(module: torch.nn.Module, name: str) -> bool:
        return (isinstance(module, torch.nn.Linear) and ".layers." in f".{name}"
                and module.in_features % 16 == 0 and module.out_features % 16 == 0)

    config = Float8LinearConfig(enable_fsdp_float8_all_gather=all_gather, emulate=emulate)
    convert_to_float8_training(model, config=config, module_filter_fn=eligible)


def after_optimizer_step(model: torch.nn.Module) -> None:
    """With float8 all-gathers, each weight's scale for the next gathers, computed once for all of them (one
    all_reduce of the amaxes within the group), as torchtitan does after every optimizer step."""
    from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

    precompute_float8_dynamic_scale_for_fsdp(model)
