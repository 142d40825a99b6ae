"""The first command on a lent GPU: `python -m bench.gpu_accept` (at most ~8 minutes on one H100 or H200).

It measures, through the real entrypoint (`torchrun -m train`), what no CPU can show, and writes it to
results/gpu/<date>/ (accept.json, README.md):
1. the prediction first: the Llama-3.1-8B job (FSDP over the node's GPUs, the authors' precision, 2 x 2,048 tokens
   per GPU) on as many layers as the memory model fits, its memory per device from the memory model and from the
   dry-run (fake tensors: launcher.actions.dryrun), written before anything trains;
2. that job run each way its layers can run (bench/gpu_job.py's VARIANTS: eager, compiled, compiled with selective
   activation checkpointing, and with float8 where the GPU has fp8), --steps timed steps each after a warm-up:
   tokens/s per GPU, MFU, peak allocated and reserved beside the dry-run's prediction, the device memory left free,
   compile time, graphs and recompilations, energy and tokens per joule;
3. the parity rows: torchtitan's published Llama-3.1-8B setting (bf16 compute over fp32 master weights, gradients
   reduced in fp32, clipped at norm 1.0, selective activation checkpointing, 2 x 8,192 tokens, all 32 layers),
   compiled and compiled + float8, each fitted to the GPUs with its own checkpointing; torchtitan's figure is
   printed beside a row only when the GPU model, their count, the layers and the tokens all match, and the
   settings that differ are named otherwise.
`--device cpu --ranks 2 --model tiny` rehearses it on CPU ranks (the same code path; tests/test_gpu_check.py).
"""
from __future__ import annotations

import argparse
import copy
import json
import shlex
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench import gpu_check, gpu_job
from train.contract.common import write_atomic
from train.contract.machine import commit, describe

PARITY = {"precision": "bf16", "reduce_dtype": "fp32", "max_norm": 1.0, "activation_checkpointing": "selective",
          "compile": True}  # torchtitan's Llama-3.1-8B training settings (its llama3_8b.toml), beside ours
PARITY_VARIANTS = {"parity: compiled + selective AC": {}, "parity: compiled + selective AC + float8": {"float8": True}}


def prediction(spec: dict, ranks: int) -> dict:
    """The job's memory per device as the memory model and the dry-run predict it, before it runs."""
    model_bytes, dryrun_bytes = gpu_job.predicted_bytes(spec)
    return {"layers": spec["model"]["num_hidden_layers"], "ranks": ranks, "memory_model_bytes": model_bytes,
            "dryrun_bytes": dryrun_bytes, "predicted_at": time.strftime("%Y-%m-%dT%H:%M:%S")}


def parity_rows(args, device: str, out: Path, name: str) -> list[dict]:
    """torchtitan's setting (PARITY), each variant fitted with its own checkpointing, beside its figure where
    every setting matches."""
    rows = []
    for i, (variant, keys) in enumerate(PARITY_VARIANTS.items()):
        spec = gpu_job.job_spec(args.model, None, args.ranks, args.steps + 1, args.parity_seq_len, args.batch, device,
                                out, args.peak_flops or (gpu_job.peak_flops_of(name) if device == "cuda" else None))
        spec["train"].update(PARITY)
        capacity = torch.cuda.get_device_properties(0).total_memory * gpu_job.USABLE if device == "cuda" else None
        layers, whole = gpu_job.layers_that_fit(spec, capacity)
        if layers == 0:
            rows.append({"variant": variant, "not_run": f"not one layer fits {args.ranks} GPU(s)"})
            continue
        spec["model"]["num_hidden_layers"] = layers
        row = gpu_job.run_variant(spec, variant, keys, 10 + i, args, device, out, gpu_check.train)
        figure = gpu_job.torchtitan_figures(name, args.ranks, args.batch, args.parity_seq_len, layers, whole).get(
            variant.removeprefix("parity: "))
        row["torchtitan"] = figure
        row["differs"] = differences(name, args.ranks, args.batch, args.parity_seq_len, layers, whole)
        rows.append(row)
    return rows


def differences(name: str, gpus: int, batch: int, seq_len: int, layers: int, whole: int) -> list[str]:
    """What keeps a row from torchtitan's published figures (none: comparable)."""
    out = []
    published = {model for model, _ in gpu_job.TORCHTITAN}
    if not any(model in name for model in published):
        out.append(f"GPU {name} (theirs: {', '.join(sorted(published))})")
    if gpus not in {n for _, n in gpu_job.TORCHTITAN}:
        out.append(f"{gpus} GPU(s) (theirs: {', '.join(str(n) for _, n in sorted(gpu_job.TORCHTITAN))})")
    if (batch, seq_len) != gpu_job.TORCHTITAN_TOKENS:
        out.append(f"{batch} x {seq_len} tokens (theirs: {gpu_job.TORCHTITAN_TOKENS[0]} x "
                   f"{gpu_job.TORCHTITAN_TOKENS[1]})")
    if layers != whole:
        out.append(f"{layers} of {whole} layers")
    return out


def readme(report: dict) -> str:
    """results/gpu/<date>/README.md: what ran, where, and what it measured, from accept.json alone."""
    p = report["prediction"]
    lines = [f"# GPU acceptance run, {report['date']}", "",
             f"- Command: `{report['command']}`", f"- Commit: {report['commit']}",
             f"- Machine: {json.dumps(report['machine'])}", f"- torch {report['torch']}", "",
             f"Predicted before any run ({p['predicted_at']}): {p['layers']} layer(s) of {report['model']} over "
             f"{p['ranks']} rank(s), memory model {p['memory_model_bytes'] / 1e9:.2f} GB, dry-run "
             f"{p['dryrun_bytes'] / 1e9:.2f} GB per device.", "",
             "| variant | tokens/s/GPU | MFU | peak allocated (GB) | dry-run / allocated | peak reserved (GB) | free "
             "after (GB) | compile (s) | graphs / recompiles | tokens/J | torchtitan |",
             "|:---|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---|"]
    for row in report["rows"]:
        lines.append(_readme_row(row, p))
    lines += ["", "Each row is one run of the real entrypoint; tokens/s and tokens/J leave the first (warm-up) "
              "step out; compilation is timed apart. Nothing here is a prediction but the first line."]
    return "\n".join(lines) + "\n"


def _gb(value) -> str:
    return "-" if value is None else f"{value / 1e9:.2f}"


def _readme_row(row: dict, predicted: dict) -> str:
    if "tokens_per_s_per_device" not in row:
        why = row.get("not_run") or "FAILED: " + row["failed"]
        return f"| {row['variant']} | {why} |" + " |" * 9
    same_job = row["layers"] == predicted["layers"] and not row["variant"].startswith("parity")
    ratio = f"{predicted['dryrun_bytes'] / row['peak_allocated_bytes']:.3f}" if same_job else "-"
    mfu = "-" if row["mfu"] is None else f"{row['mfu']:.1%}"
    per_joule = "-" if row["tokens_per_j"] is None else f"{row['tokens_per_j']:,.1f}"
    theirs = "-"
    if row.get("torchtitan"):
        theirs = f"{row['torchtitan']:,} ({row['tokens_per_s_per_device'] / row['torchtitan']:.2f}x)"
    elif row.get("differs"):
        theirs = "differs: " + "; ".join(row["differs"])
    return (f"| {row['variant']} | {row['tokens_per_s_per_device']:,.0f} | {mfu} | {_gb(row['peak_allocated_bytes'])} "
            f"| {ratio} | {_gb(row['peak_reserved_bytes'])} | {_gb(row['device_free_bytes'])} | "
            f"{row['compile_s']:.1f} | {row['compile_graphs']} / {row['compile_recompiles']} | {per_joule} | "
            f"{theirs} |")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    parser.add_argument("--ranks", type=int, default=None, help="default: every GPU of the node")
    parser.add_argument("--model", default="llama3_8b")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per run, after one warm-up step")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--parity-seq-len", type=int, default=gpu_job.TORCHTITAN_TOKENS[1])
    parser.add_argument("--batch", type=int, default=2, help="sequences per GPU per step")
    parser.add_argument("--peak-flops", type=float, default=None, help="per device, for MFU")
    parser.add_argument("--out", type=Path, default=None, help="default: results/gpu/<date>")
    args = parser.parse_args(argv)
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    if device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda but torch sees no GPU")
    args.ranks = args.ranks or (torch.cuda.device_count() if device == "cuda" else 2)
    # gpu_job's names for the job's settings
    args.job_steps, args.job_seq_len, args.job_batch = args.steps, args.seq_len, args.batch
    out = args.out or Path("results") / "gpu" / time.strftime("%Y-%m-%d")
    out.mkdir(parents=True, exist_ok=True)
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    report = {"command": shlex.join([sys.executable, "-m", "bench.gpu_accept", *(argv or sys.argv[1:])]),
              "commit": commit(), "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__,
              "machine": describe(f"{name} x{args.ranks}" if device == "cuda" else None), "model": args.model}
    with tempfile.TemporaryDirectory() as tmp:
        runs = Path(tmp)
        base, name, layers, whole = gpu_job.fitted_job(args, device, runs)
        if layers == 0:
            print(f"gpu_accept: {args.model} does not fit {args.ranks} GPU(s) even with one layer")
            return 1
        report["prediction"] = prediction(base, args.ranks)
        write_atomic(out / "accept.json", json.dumps(report, indent=2) + "\n")  # the prediction, registered first
        print(f"gpu_accept: predicted {layers} of {whole} layers at "
              f"{report['prediction']['dryrun_bytes'] / 1e9:.2f} GB per device (dry-run); running")
        ok, rows = gpu_job.compare(args, device, runs, gpu_check.train)
        parity = parity_rows(args, device, runs, name)
        for row in parity:
            beside = (f"{row['torchtitan']:,}" if row.get("torchtitan")
                      else "differs: " + "; ".join(row.get("differs", [])))
            print(gpu_job.row_line(row, beside))
    report["rows"] = rows + [copy.deepcopy(row) for row in parity]
    ok &= not any("failed" in row for row in parity)
    write_atomic(out / "accept.json", json.dumps(report, indent=2) + "\n")
    write_atomic(out / "README.md", readme(report))
    print(f"gpu_accept: {'done' if ok else 'a run FAILED'}; written to {out}/accept.json and README.md")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
