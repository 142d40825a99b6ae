"""A run's trained model as a Hugging Face directory (launcher.actions.export), from its latest checkpoint read in one
process without a process group.

DCP's no-dist load gathers every layout's shards (FSDP, HSDP, FL, tp or pp) into full tensors. Where the checkpoint
holds one model per federation group (a run whose last step is not a multiple of A: its final FedAvg came after the
checkpoint), the groups are averaged in fp32 as FedAvg averages them. Then LlamaForCausalLM.save_pretrained, and the
run's tokenizer files beside it where its data names one.

torch is imported inside the functions, so the launcher's refusals (no checkpoint, say) come before its import.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from train.contract.spec import RunSpec

CHECKPOINT = re.compile(r"step-\d+")  # train.runtime.checkpoint's published names: step-NNNNNN with a meta.json
GROUP = re.compile(r"(fed(\d+))\.model\.")  # a model stored per federation group (Checkpointer._state)
WEIGHTS = (".safetensors", ".bin", ".pt", ".pth", ".h5", ".msgpack", ".ckpt")  # never copied as tokenizer files


@dataclass
class Exported:
    """What an export wrote: the directory, the checkpoint's step, how its model was made, the files."""
    out: Path
    checkpoint: Path
    step: int
    params: int
    dtype: str
    groups: int  # federation groups averaged (0: the checkpoint held one model)
    outer_step: bool  # DiLoCo's outer step taken on the average, as the run's final one was
    files: list[str]
    tokenizer_files: list[str]
    notes: list[str] = field(default_factory=list)


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The run's newest published checkpoint (Checkpointer.latest's rule, without torch): an unfinished write has no
    meta.json."""
    root = Path(run_dir) / "checkpoints"
    done = sorted(p for p in root.glob("step-*") if CHECKPOINT.fullmatch(p.name) and (p / "meta.json").exists())
    return done[-1] if done else None


def tokenizer_dir(spec: RunSpec) -> str | None:
    """The tokenizer the run's data names: data=text always, data=tokens with data.tokenizer."""
    return getattr(spec.data, "tokenizer", None) or None


def model_state(checkpoint: Path, spec: RunSpec) -> tuple[dict, int, bool]:
    """The checkpoint's model as full tensors keyed as LlamaForCausalLM names them, the number of federation groups
    averaged (0: it stored one model) and whether DiLoCo's outer step was taken. Groups are loaded one at a time
    into an fp32 sum, divided by F and cast back, as FedAvg does (train.federation.federated): two models in memory
    at most, whatever F."""
    import torch
    from torch.distributed.checkpoint import FileSystemReader, load
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    stored = FileSystemReader(str(checkpoint)).read_metadata().state_dict_metadata
    tensors = {k: m for k, m in stored.items() if isinstance(m, TensorStorageMetadata)}
    groups = sorted({(int(m.group(2)), m.group(1)) for k in tensors if (m := GROUP.match(k))})
    prefixes = [f"{name}.model." for _, name in groups] or ["model."]

    def read(prefix: str) -> dict:
        part = {k: torch.empty(m.size, dtype=m.properties.dtype) for k, m in tensors.items() if k.startswith(prefix)}
        with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
            warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
            load(part, checkpoint_id=str(checkpoint), no_dist=True)
        return {k[len(prefix):]: t for k, t in part.items()}

    state = read(prefixes[0])
    if len(prefixes) == 1:
        return state, 0, False
    dtypes = {k: t.dtype for k, t in state.items()}
    total = {k: t.float() for k, t in state.items()}
    for prefix in prefixes[1:]:
        for k, t in read(prefix).items():
            total[k] += t.float()
    for t in total.values():
        t.div_(len(prefixes))
    outer = spec.train.outer == "diloco" and any(k.startswith("outer.synced.") for k in tensors)
    if outer:
        _outer_step(total, read("outer.synced."), read("outer.momentum."), spec.train.outer_lr,
                    spec.train.outer_momentum)
    return {k: t.to(dtypes[k]) for k, t in total.items()}, len(prefixes), outer


def _outer_step(average: dict, synced: dict, momentum: dict, lr: float, mu: float) -> None:
    """DiLoCo's outer step on the average a, in place, as train.federation.outer takes it after the final FedAvg:
    m <- mu m + (synced - a), then a + (1 - lr)(synced - a) - lr mu m."""
    for k, a in average.items():
        s, m = synced[k].float(), momentum[k].float()
        m = (s + mu * m).sub_(a)
        a.lerp_(s, 1 - lr).add_(m, alpha=-lr * mu)


def export(spec: RunSpec, run_dir: Path, out: Path) -> Exported:
    """Write the run's latest checkpoint (run_dir/checkpoints) to `out` (absent or an empty directory, which the
    caller checked) as a Hugging Face directory. Written beside `out` first and renamed into place, so a failed
    export leaves no half-written directory to refuse next time."""
    import torch

    from train import model as models

    checkpoint = latest_checkpoint(run_dir)
    meta = json.loads((checkpoint / "meta.json").read_text())
    state, groups, outer = model_state(checkpoint, spec)
    config = models.llama_config(spec.model)
    config.use_cache = True  # training turns the KV cache off; whoever loads the model may generate with it
    with torch.device("meta"):
        model = models.build(config, "meta")
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    persistent = {k for k, _ in model.named_parameters()} | {k for k in model.state_dict()}
    missing = [k for k in missing if k in persistent and not (config.tie_word_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise RuntimeError(f"checkpoint {checkpoint} does not hold model {spec.model.to_dict()}: missing "
                           f"{missing[:3]}, unexpected {unexpected[:3]}")
    if config.tie_word_embeddings:
        model.tie_weights()
    dtype = next(iter(state.values())).dtype  # save_pretrained records it in config.json
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        model.save_pretrained(tmp)
        files = sorted(p.name for p in tmp.iterdir())
        copied = _copy_tokenizer(tokenizer_dir(spec), tmp)
        os.replace(tmp, out)  # onto an empty directory too (rename(2))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return Exported(out, checkpoint, meta["step"], models.count_params(model), str(dtype).removeprefix("torch."),
                    groups, outer, files, copied, _notes(spec, meta, groups))


def _copy_tokenizer(directory: str | None, out: Path) -> list[str]:
    """The tokenizer directory's files (not its subdirectories, nor weights or a config.json of a model directory
    it may be, which would replace the export's own)."""
    if directory is None or not Path(directory).is_dir():
        return []
    copied = []
    for path in sorted(Path(directory).iterdir()):
        if path.is_file() and not (out / path.name).exists() and not path.name.endswith(WEIGHTS):
            shutil.copy2(path, out / path.name)
            copied.append(path.name)
    return copied


def _notes(spec: RunSpec, meta: dict, groups: int) -> list[str]:
    """Where the export differs from the model the run evaluated last, said rather than hidden."""
    t, notes = spec.train, []
    if meta["step"] < t.steps:
        notes.append(f"the checkpoint is of step {meta['step']} of {t.steps}: the run did not finish")
    if groups and not t.final_average:
        notes.append(f"train.final_average=false: the run evaluated its {groups} groups' own models, not this average")
    elif groups and t.aggregation_dtype != "fp32":
        notes.append(f"the run's final average exchanged {t.aggregation_dtype} pseudo-gradients; this is the exact "
                     f"fp32 average, so it differs from the run's model by that rounding")
    if t.precision == "bf16":
        notes.append("the run computed in bf16 (train.precision=bf16); these are its fp32 master weights")
    tokenizer = tokenizer_dir(spec)
    if tokenizer is not None and not Path(tokenizer).is_dir():
        notes.append(f"the run's tokenizer {tokenizer} is not here: no tokenizer files copied")
    return notes
