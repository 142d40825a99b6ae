"""action=export: a run's trained model handed back as a Hugging Face directory that LlamaForCausalLM.from_pretrained
loads (the form the neighbouring tools' users ask for).

    python -m launcher sweep=NAME [cluster=NAME] action=export run=RUN_ID [export.out=DIR]

It reads the run's last checkpoint on this machine, in one process (train.job.export), so it needs the run
directory and memory for two fp32 copies of the model, not the cluster. Refused in one line before anything is written:
a run id the sweep does not have, a run with no checkpoint, an export.out that exists and is not empty.
"""
from __future__ import annotations

from pathlib import Path

from launcher.actions.control import recorded_runs
from launcher.settings import Settings
from launcher.sweep import Run
from train.contract.common import ConfigError, FedshardError
from train.contract.spec import RunSpec
from train.job.export import latest_checkpoint

SHOWN = 8  # run ids named in a refusal, before "..."


def target(settings: Settings, runs: list[Run]) -> tuple[RunSpec, Path, Path]:
    """The run's spec, its directory and the export's directory, after every refusal that needs no torch."""
    if not settings.run:
        raise ConfigError("action=export needs run=RUN_ID (action=status lists the sweep's runs)")
    ids = [r.run_id for r in recorded_runs(settings, runs)]
    if settings.run not in ids:
        listed = ", ".join(ids[:SHOWN]) + (f", ... ({len(ids)} in all)" if len(ids) > SHOWN else "")
        raise ConfigError(f"run={settings.run} is not a run of sweep {settings.sweep.name} on cluster "
                          f"{settings.cluster.name}; its runs: {listed or 'none'}")
    run_dir = settings.sweep_dir / settings.run
    if latest_checkpoint(run_dir) is None:
        raise ConfigError(f"{settings.run} has no checkpoint to export ({run_dir / 'checkpoints'} holds none): a run "
                          f"trained with train.checkpoint_every=K makes one every K steps and after its last step")
    out = Path(settings.export.out).expanduser().resolve() if settings.export.out else run_dir / "hf"
    if out.exists() and not out.is_dir():
        raise ConfigError(f"export.out={out} is a file, not a directory")
    if out.is_dir() and any(out.iterdir()):
        raise ConfigError(f"export.out={out} exists and is not empty: name a new or empty directory "
                          f"(export.out=DIR), or delete it")
    try:
        spec = RunSpec.load(run_dir / "spec.json")
    except FedshardError as exc:
        raise ConfigError(f"{settings.run}: {exc}") from None
    return spec, run_dir, out


def export(settings: Settings, runs: list[Run]) -> int:
    """Write the run's model to export.out and say what it holds."""
    spec, run_dir, out = target(settings, runs)
    from train.job.export import export as write  # torch, transformers: only once the refusals are behind

    try:
        done = write(spec, run_dir, out)
    except OSError as exc:  # a full disk, a directory this user cannot write: no traceback for it
        raise ConfigError(f"export.out={out} cannot be written: {exc.strerror or exc}"
                          + (f" ({exc.filename})" if exc.filename else "")) from None
    L = spec.layout
    grid = f"{L.strategy} (F={L.F}, R={L.R}, S={L.S}{f', A={L.A}' if L.A else ''}" \
           f"{f', tp={L.T}' if L.T > 1 else ''}{f', pp={L.P}' if L.P > 1 else ''})"
    if done.groups:
        how = (f"the fp32 average of its {done.groups} federation groups' models, as its final FedAvg averaged them "
               f"(the checkpoint, taken between two FedAvgs, holds one per group)"
               + ("; then DiLoCo's outer step" if done.outer_step else ""))
    elif L.F > 1:
        how = "one model: the checkpoint follows a FedAvg, so every federation group held it"
    else:
        how = "one model, its shards gathered"
    model = spec.model.preset or "custom"
    print(f"exported {settings.run} to {done.out}")
    print(f"  model: Llama {model}, {done.params:,} parameters, {done.dtype}; step {done.step} of "
          f"{spec.train.steps}, from {done.checkpoint.name} of {grid}")
    print(f"  {how}")
    print(f"  files: {', '.join(done.files)}"
          + (f"; tokenizer: {', '.join(done.tokenizer_files)}" if done.tokenizer_files else "; no tokenizer"))
    for note in done.notes:
        print(f"  note: {note}")
    print(f"  load it: LlamaForCausalLM.from_pretrained({str(done.out)!r})")
    return 0
