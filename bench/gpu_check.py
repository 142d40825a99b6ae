"""The first command to run on a GPU node: `python -m bench.gpu_check`.

Runs the four strategies over the node's GPUs (NCCL, bf16 compute over fp32 master weights) for a few
steps of a small Llama through the real entrypoint (`torchrun -m train SPEC.json`), and checks:

1. every step's loss (--loss-steps: the first N) against the same strategy in fp32 on CPU ranks (gloo): relative
   difference within --tolerance (default 2 %: bf16 keeps 8 bits of mantissa, so the losses agree to ~3 digits);
2. averaging identical bf16 models is a no-op: FL+FSDP with 3 groups of 1 rank, bf16 parameters
   (precision=paper) and a learning rate of 1e-30, so the groups never diverge, gives bitwise the same
   losses averaging after every step (A=1) as never averaging;

and prints per strategy tokens/s per GPU, MFU (peak from --peak-flops, or bench/gpu_job.py's table of GPU models),
the exposed communication per step (the steps' waits on collectives, train/measure/exposed.py) and tokens per joule
(NVML's energy counter, read once per node; `pip install nvidia-ml-py`, else the reason it is missing is printed).
Layouts need 2 ranks (FL+HSDP: 4); those that do not fit the node's GPUs are skipped, saying so.
With `--model PRESET` (llama3_8b: the paper's) it then measures the job itself (bench/gpu_job.py): FSDP over the
node's GPUs at 2 x 2,048 tokens per GPU, tokens/s, MFU, peak memory against the memory model and the dry-run,
energy. `--compare` then runs that job once per way its layers can run (bench/gpu_job.py's VARIANTS: eager,
compiled, compiled with selective activation checkpointing, and with float8 where the GPU has fp8) side by side,
with torchtitan's published tokens/s per GPU beside them for the same GPU model, count and setting.
`--device cpu --ranks N` runs the same checks on CPU ranks (that is how the tests run it). Exit 1 if any
check fails. Run: python -m bench.gpu_check [--steps 8] [--check-model small] [--seq-len 256] [--out DIR]
[--strategies fsdp,hsdp,...] (a subset: a quicker check) [--model llama3_8b [--job-steps 20] [--compare]].
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from bench import gpu_job
from train.contract.common import FedshardError
from train.contract.layout import STRATEGIES
from train.contract.result import RunResult
from train.contract.spec import RunSpec


def layouts(ranks: int) -> dict[str, tuple[int, int, int]]:
    """(F, R, S) per strategy on `ranks` ranks: two groups or replicas where the strategy has them."""
    out = {"fsdp": (1, 1, ranks)}
    if ranks % 2 == 0:
        out |= {"hsdp": (1, 2, ranks // 2), "fl_fsdp": (2, 1, ranks // 2)}
    if ranks % 4 == 0:
        out["fl_hsdp"] = (2, 2, ranks // 4)
    return out


def peak_flops(device: str) -> float | None:
    return gpu_job.peak_flops_of(torch.cuda.get_device_name()) if device == "cuda" else None


def train(spec: dict, ranks: int, out: Path, device: str) -> tuple[dict, list[float]]:
    """One run through `torchrun -m train`; its result.json and per-step losses."""
    spec_path = out / f"{spec['run_id']}.json"
    spec_path.write_text(json.dumps(spec))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "MASTER_", "RANK", "WORLD_SIZE"))}
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    status, stderr = torchrun(spec_path, ranks, env)
    if status != 0:
        raise RuntimeError(f"{spec['run_id']} failed (exit {status}): {stderr.strip()[-2000:]}")
    run_dir = Path(spec["out_dir"])
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return RunResult.load(run_dir / "result.json"), [r["loss"] for r in rows]


def torchrun(spec_path: Path, ranks: int, env: dict) -> tuple[int, str]:
    """`torchrun --standalone --nproc_per_node RANKS -m train SPEC`: its exit status and stderr."""
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                           str(ranks), "-m", "train", str(spec_path)], env=env, capture_output=True, text=True)
    return proc.returncode, proc.stderr


def spec(run_id: str, strategy: str, layout, out: Path, args, device: str, precision: str, **train) -> dict:
    F, R, S = layout
    return {"strategy": strategy, "F": F, "R": R, "S": S, "A": 2 if strategy.startswith("fl_") else None,
            "run_id": run_id, "out_dir": str(out / run_id), "device": device, "backend": "auto",
            "model": {"preset": args.check_model}, "peak_flops": args.peak_flops or peak_flops(device),
            "train": {"steps": args.steps, "seq_len": args.seq_len, "batch_per_rank": args.batch,
                      "log_every": args.steps, "precision": precision, **train}}


def check_strategies(args, device: str, out: Path) -> bool:
    ok = True
    print(f"{'strategy':<8} {'(F,R,S)':<10} {'tokens/s/dev':>12} {'MFU':>7} {'exposed':>10} {'tokens/J':>9}  "
          f"{args.loss_steps} step losses vs fp32 CPU")
    energy_sources = set()
    chosen = {s: layout for s, layout in layouts(args.ranks).items() if s in args.strategies}
    for strategy, layout in chosen.items():
        result, losses = train(spec(f"{strategy}-{device}", strategy, layout, out, args, device, "bf16"),
                               args.ranks, out, device)
        _, reference = train(spec(f"{strategy}-reference", strategy, layout, out, args, "cpu", "fp32"),
                             args.ranks, out, "cpu")
        worst = max(abs(a - b) / abs(b) for a, b in zip(losses[:args.loss_steps], reference[:args.loss_steps]))
        passed = worst <= args.tolerance
        ok &= passed
        mfu = f"{result.mfu:.1%}" if result.mfu is not None else "-"
        exposed = f"{result.exposed_comm_s * 1e3:.1f} ms" if result.exposed_comm_s is not None else "-"
        per_joule = f"{result.tokens_per_j:,.1f}" if result.tokens_per_j is not None else "-"
        energy_sources.add(result.energy_source)
        print(f"{strategy:<8} {str(layout).replace(' ', ''):<10} {result.tokens_per_s_per_device:>12,.0f} "
              f"{mfu:>7} {exposed:>10} {per_joule:>9}  max rel diff {worst:.2e} "
              f"{'ok' if passed else f'FAIL (> {args.tolerance:g})'}")
    print("energy: " + "; ".join(sorted(energy_sources)))
    skipped = sorted(set(args.strategies) - set(chosen))
    if skipped:
        print(f"skipped {', '.join(skipped)}: {args.ranks} rank(s) cannot hold their layouts")
    return ok


def check_bf16_average_is_a_no_op(args, device: str, out: Path) -> bool | None:
    """FL+FSDP, bf16 parameters, lr 1e-30: averaging every step must not change a single loss."""
    if args.ranks < 3:
        print("skipped the bf16 averaging check: it needs 3 ranks (a bf16 sum of 2 equal numbers is exact)")
        return None
    layout = (3, 1, 1)  # 3 equal bf16 numbers: x + x + x rounds (sums of 2 or 4 by doubling would not)
    losses = {}
    for A in (1, args.steps + 1):
        run = spec(f"noop-A{A}", "fl_fsdp", layout, out, args, device, "paper", lr=1e-30, final_average=False)
        losses[A] = train({**run, "A": A}, 3, out, device)[1]
    same = losses[1] == losses[args.steps + 1]
    print(f"bf16 FedAvg of identical models (FL+FSDP {layout}, A=1 vs never, {args.steps} steps): "
          + ("losses bitwise equal, ok" if same else f"FAIL: {losses[1]} vs {losses[args.steps + 1]}"))
    return same


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    parser.add_argument("--ranks", type=int, default=None, help="default: every GPU of the node")
    parser.add_argument("--check-model", default="small", help="the checks' model preset (small: ~5 M parameters)")
    parser.add_argument("--model", default=None, help="measure the job with this model preset (llama3_8b: the "
                        "paper's; default: no job measurement)")
    parser.add_argument("--job-steps", type=int, default=20, help="the job's timed steps, after one warm-up step")
    parser.add_argument("--job-seq-len", type=int, default=2048)
    parser.add_argument("--job-batch", type=int, default=2, help="the job's sequences per GPU per step")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--strategies", default=",".join(STRATEGIES),
                        help="comma-separated subset of the four strategies to check (all)")
    parser.add_argument("--loss-steps", type=int, default=None, help="leading steps whose losses are compared (all)")
    parser.add_argument("--compare", action="store_true", help="with --model: the job eager, compiled, with "
                        "selective activation checkpointing and float8, side by side")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--batch", type=int, default=2, help="sequences per rank per step")
    parser.add_argument("--tolerance", type=float, default=0.02, help="relative loss difference allowed")
    parser.add_argument("--peak-flops", type=float, default=None, help="per device, for MFU")
    parser.add_argument("--out", type=Path, default=None, help="where the runs go (default: a temporary dir)")
    args = parser.parse_args(argv)
    args.strategies = args.strategies.split(",")
    unknown = sorted(set(args.strategies) - set(STRATEGIES))
    if unknown:
        parser.error(f"--strategies: unknown {', '.join(unknown)}; expected some of {', '.join(STRATEGIES)}")
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    if device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda but torch sees no GPU")
    if args.model:
        try:
            RunSpec.from_dict(gpu_job.job_spec(args.model, None, 1, 2, args.job_seq_len, args.job_batch, "cpu",
                                               Path("/nonexistent"), None))
        except FedshardError as exc:
            parser.error(f"--model {args.model}: {exc}")
    if args.compare and not args.model:
        parser.error("--compare measures the job: give --model (llama3_8b: the paper's)")
    args.loss_steps = args.loss_steps or args.steps
    args.ranks = args.ranks or (torch.cuda.device_count() if device == "cuda" else 2)
    if device == "cuda" and args.ranks > torch.cuda.device_count():
        parser.error(f"--ranks {args.ranks} but only {torch.cuda.device_count()} GPU(s): NCCL needs one GPU per rank")
    print(f"gpu_check on {args.ranks} {device} rank(s)"
          + (f" ({torch.cuda.get_device_name()})" if device == "cuda" else "") + f", torch {torch.__version__}")
    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        ok = check_strategies(args, device, out)
        ok &= check_bf16_average_is_a_no_op(args, device, out) is not False
        if args.model:
            ok &= gpu_job.measure(args, device, out, train)
        if args.compare:
            ok &= gpu_job.compare(args, device, out, train)[0]
    print("gpu_check: " + ("all checks passed" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
