"""The paper's job measured on one node (`python -m bench.gpu_check --model llama3_8b`): FSDP over every GPU of the
node (one GPU: the model unsharded), the authors' settings (train=paper: bf16 parameters, gradients reduced in bf16,
2 x 2,048 tokens per GPU), through the real entrypoint, and what it cost against what fedshard predicted.

As many decoder layers as the memory model says fit the GPUs (all 32 of Llama-3.1-8B where they do; the line says
how many when not). Steps are timed by the trainer's device events; tokens/s leaves out the first (warm-up) step.
Printed: tokens/s per GPU, MFU with the GPU model's dense bf16 peak, the run's peak allocation
(torch.cuda.max_memory_allocated, max over ranks) against the memory model and the dry-run of the same spec, and
NVML energy. On CPU ranks (the tests) the peak is the process's resident set, which the two models do not
predict: it is printed, not compared.
"""
from __future__ import annotations

import copy
import tempfile
from pathlib import Path

import torch

from launcher.actions.dryrun import memory_of, play, ranks_to_play
from launcher.placement.memory import per_device, work_of
from train.contract.spec import RunSpec
from train.parallel import float8

# Dense bf16 tensor-core peaks per GPU, most specific name first (torch.cuda.get_device_name: "NVIDIA H100 PCIe",
# "NVIDIA H100 NVL", "NVIDIA H100 80GB HBM3" for the SXM part, "NVIDIA H200", "NVIDIA A100-SXM4-80GB").
PEAK_BF16_FLOPS = (("H100 PCIe", 756e12), ("H100 NVL", 835e12), ("H100", 989e12), ("H200", 989e12),
                   ("A100", 312e12))
USABLE = 0.92  # of a GPU's memory the model may plan for: the CUDA context, NCCL and fragmentation take the rest
# --compare: how the job's layers run, each beside the last (fused AdamW is on in all of them: the trainer's on CUDA)
VARIANTS = {"eager": {}, "compiled": {"compile": True},
            "compiled + selective AC": {"compile": True, "activation_checkpointing": "selective"},
            "compiled + selective AC + float8": {"compile": True, "activation_checkpointing": "selective",
                                                 "float8": True}}
# torchtitan's published tokens/s per GPU, Llama-3.1-8B under FSDP, 2 x 8,192 tokens per GPU, selective activation
# checkpointing, bf16 (its docs/performance.md, Table 1, and benchmarks/llama3_h100_202412_torchtitan.md; H100s of
# 96 GB at 500 W): {(GPU model, GPUs): {our variant of the same setting: figure}}. Its plain FSDP row (selective
# checkpointing, not compiled) has no variant of ours beside it.
TORCHTITAN = {("H100", 8): {"compiled + selective AC": 6_667, "compiled + selective AC + float8": 8_532},
              ("H100", 128): {"compiled + selective AC": 6_514, "compiled + selective AC + float8": 8_380}}
TORCHTITAN_TOKENS = (2, 8192)  # its batch per GPU and sequence length


def peak_flops_of(name: str) -> float | None:
    """The dense bf16 peak of the GPU model `name`, None for one not in the table."""
    return next((flops for key, flops in PEAK_BF16_FLOPS if key in name), None)


def job_spec(model: str, layers: int | None, ranks: int, steps: int, seq_len: int, batch: int, device: str,
             out: Path, peak_flops: float | None) -> dict:
    """FSDP over `ranks` GPUs with the paper preset's training keys."""
    return {"strategy": "fsdp", "F": 1, "R": 1, "S": ranks, "run_id": "job", "out_dir": str(out / "job"),
            "device": device, "backend": "auto", "peak_flops": peak_flops,
            "model": {"preset": model, **({"num_hidden_layers": layers} if layers else {})},
            "train": {"steps": steps, "seq_len": seq_len, "batch_per_rank": batch, "log_every": steps,
                      "precision": "paper", "reduce_dtype": "bf16", "lr": 3e-4, "warmup_frac": 0.1}}


def layers_that_fit(spec: dict, capacity: float | None) -> tuple[int, int]:
    """(layers to run, the model's layers): the most the memory model fits under `capacity` bytes (None: all)."""
    whole = RunSpec.from_dict(spec).model.llama_kwargs["num_hidden_layers"]
    if capacity is None:
        return whole, whole
    for layers in range(whole, 0, -1):
        trial = copy.deepcopy(spec)
        trial["model"]["num_hidden_layers"] = layers
        run = RunSpec.from_dict(trial)
        if per_device(run.model.llama_kwargs, work_of(run)).total <= capacity:
            return layers, whole
    return 0, whole


def predicted_bytes(spec: dict) -> tuple[float, float]:
    """(memory model, dry-run) peak bytes per device for `spec`."""
    run = RunSpec.from_dict(spec)
    model = per_device(run.model.llama_kwargs, work_of(run)).total
    with tempfile.TemporaryDirectory() as tmp:
        dryrun, _ = memory_of([play(run, rank, Path(tmp)) for rank in ranks_to_play(run)])
    return model, dryrun


def fitted_job(args, device: str, out: Path) -> tuple[dict, str, int, int]:
    """(the job's spec on as many layers as fit, the device's name, those layers, the model's layers); layers
    is 0 when not even one fits."""
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    capacity = torch.cuda.get_device_properties(0).total_memory * USABLE if device == "cuda" else None
    peak = args.peak_flops or (peak_flops_of(name) if device == "cuda" else None)
    spec = job_spec(args.model, None, args.ranks, args.job_steps + 1, args.job_seq_len, args.job_batch, device, out,
                    peak)
    layers, whole = layers_that_fit(spec, capacity)
    if layers == 0:
        print(f"job: {args.model} does not fit {args.ranks} GPU(s) of {capacity / 1e9:.0f} GB even with one layer")
    spec["model"]["num_hidden_layers"] = layers
    return spec, name, layers, whole


def measure(args, device: str, out: Path, train) -> bool:
    """Run the job (train: gpu_check's runner) and print its line; False if it could not run."""
    spec, name, layers, whole = fitted_job(args, device, out)
    if layers == 0:
        return False
    said = "all" if layers == whole else f"{layers} of {whole} (the memory model fits no more on {args.ranks} GPU(s))"
    print(f"job: {args.model}, {said} layers, FSDP over {args.ranks} {name} rank(s), precision paper, "
          f"{args.job_batch} x {args.job_seq_len} tokens per GPU, {args.job_steps} timed steps after one warm-up")
    model_bytes, dryrun_bytes = predicted_bytes(spec)
    result, _ = train(spec, args.ranks, out, device)
    mfu = f"{result.mfu:.1%}" if result.mfu is not None else "- (no peak known for this GPU: --peak-flops)"
    first = f"{result.first_step_s:.2f} s" if result.first_step_s is not None else "-"
    print(f"job: {result.tokens_per_s_per_device:,.0f} tokens/s per GPU, MFU {mfu}, first step {first}")
    measured = result.peak_memory_bytes
    if device == "cuda":
        print(f"job: peak allocated {measured / 1e9:.2f} GB; memory model {model_bytes / 1e9:.2f} GB "
              f"({model_bytes / measured:.3f} of it), dry-run {dryrun_bytes / 1e9:.2f} GB "
              f"({dryrun_bytes / measured:.3f})")
    else:
        print(f"job: CPU resident set {measured / 1e9:.2f} GB (not what the models predict: a GPU's allocation); "
              f"memory model {model_bytes / 1e9:.3f} GB, dry-run {dryrun_bytes / 1e9:.3f} GB")
    energy = f"{result.energy_j:,.0f} J, {result.tokens_per_j:,.1f} tokens/J" if result.energy_j is not None else "-"
    print(f"job: energy {energy} ({result.energy_source})")
    return True


def torchtitan_figures(name: str, gpus: int, batch: int, seq_len: int, layers: int, whole: int) -> dict[str, int]:
    """torchtitan's published figures for this GPU model and count at this job's setting, or none."""
    if (batch, seq_len) != TORCHTITAN_TOKENS or layers != whole:
        return {}
    return next((figures for (model, n), figures in TORCHTITAN.items() if model in name and n == gpus), {})


def run_variant(base: dict, name: str, keys: dict, index: int, args, device: str, out: Path, train) -> dict:
    """One way of running the job's layers (`keys`: train keys over `base`): its measurements as a row, or why it
    did not run ({"variant", "not_run"} / {"variant", "failed"})."""
    refused = float8.why_not(device, 1) if keys.get("float8") else None
    if refused:
        return {"variant": name, "not_run": refused}
    spec = copy.deepcopy(base)
    spec["run_id"], spec["out_dir"] = f"variant-{index}", str(out / f"variant-{index}")
    spec["train"].update(keys)
    try:
        result, _ = train(spec, args.ranks, out, device)
    except RuntimeError as exc:
        return {"variant": name, "failed": str(exc).splitlines()[0][:200]}
    return {"variant": name, "tokens_per_s_per_device": result.tokens_per_s_per_device, "mfu": result.mfu,
            "peak_allocated_bytes": result.peak_memory_bytes, "peak_reserved_bytes": result.peak_reserved_bytes,
            "device_free_bytes": result.device_free_bytes, "compile_s": result.compile_s,
            "compile_graphs": result.compile_graphs, "compile_recompiles": result.compile_recompiles,
            "energy_j": result.energy_j, "tokens_per_j": result.tokens_per_j, "energy_source": result.energy_source,
            "layers": spec["model"]["num_hidden_layers"], "train": spec["train"]}


def row_line(row: dict, beside: str = "-") -> str:
    """A variant's line in the side-by-side table."""
    if "not_run" in row or "failed" in row:
        return f"{row['variant']:<34} " + (f"not run: {row['not_run']}" if "not_run" in row else
                                           f"FAILED: {row['failed']}")
    mfu = f"{row['mfu']:.1%}" if row["mfu"] is not None else "-"
    reserved = f"{row['peak_reserved_bytes'] / 1e9:.2f}" if row["peak_reserved_bytes"] is not None else "-"
    return (f"{row['variant']:<34} {row['tokens_per_s_per_device']:>12,.0f} {mfu:>7} "
            f"{row['peak_allocated_bytes'] / 1e9:>8.2f} {reserved:>8} {row['compile_s']:>9.2f} "
            f"{row['compile_graphs']:>3}/{row['compile_recompiles']:<3} {beside}")


HEADER = (f"{'variant':<34} {'tokens/s/GPU':>12} {'MFU':>7} {'peak GB':>8} {'rsvd GB':>8} {'compile s':>9} "
          f"graphs/re  torchtitan")


def compare(args, device: str, out: Path, train) -> tuple[bool, list[dict]]:
    """Run the job once per VARIANTS entry, on the same layers (those the memory model fits without
    checkpointing), and print each one's tokens/s per GPU, MFU, peak memory, compile time and graphs side by side,
    with torchtitan's published figure for the same setting where one exists; (False if a variant failed, the
    rows)."""
    base, name, layers, whole = fitted_job(args, device, out)
    if layers == 0:
        return False, []
    theirs = torchtitan_figures(name, args.ranks, args.job_batch, args.job_seq_len, layers, whole)
    print(f"compare: {args.model}, {layers} of {whole} layers, FSDP over {args.ranks} {name} rank(s), "
          f"{args.job_batch} x {args.job_seq_len} tokens per GPU, {args.job_steps} timed steps after one warm-up; "
          f"AdamW {'fused' if device == 'cuda' else 'unfused (CPU)'} throughout")
    print(HEADER)
    rows = []
    for i, (variant, keys) in enumerate(VARIANTS.items()):
        row = run_variant(base, variant, keys, i, args, device, out, train)
        rows.append(row)
        figure = theirs.get(variant)
        beside = (f"{figure:,} ({row['tokens_per_s_per_device'] / figure:.2f}x of it)"
                  if figure and "tokens_per_s_per_device" in row else "-")
        print(row_line(row, beside))
    if not theirs:
        print(f"compare: torchtitan publishes no figure for {args.ranks} x {name} at this setting (it has 8 and 128 "
              f"H100s, all layers, {TORCHTITAN_TOKENS[0]} x {TORCHTITAN_TOKENS[1]} tokens per GPU)")
    return not any("failed" in row for row in rows), rows
