"""The step-time model on the companion study's setup (docs/explaining-seed-002.md prints this script's output).

    python docs/explaining_seed_002.py

Fernandez et al. (arXiv 2411.13055; tests/fixtures/seed_002.md, copied from the project's PAPER.md): Llama-2 7B,
context 4,096, on DGX A100 and DGX H100 nodes of 8 GPUs, FSDP with TP or PP, up to 256 nodes. Every input is a
published hardware figure or NCCL's own latency table (see the .md); nothing is fitted to the seed's measurements.
"""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from launcher.placement import topology  # noqa: E402
from launcher.placement.allocate import place  # noqa: E402
from launcher.placement.alphabeta import COLLECTIVES  # noqa: E402
from launcher.placement.costmodel import model_from_preset  # noqa: E402
from launcher.placement.network import Link, Network  # noqa: E402
from launcher.placement.steptime import (  # noqa: E402
    ASSUMED_MFU,
    Activations,
    Compute,
    Links,
    Shapes,
    StepTime,
    load,
    step_time,
)
from train.contract.layout import Layout  # noqa: E402
from train.contract.presets import flops_per_token  # noqa: E402

GB = 1e9
SEQ, G = 4096, 8  # context; GPUs per DGX node
# Llama-2 7B (HF meta-llama/Llama-2-7b-hf config.json): 6,738,415,616 parameters, untied embeddings, no GQA.
# train/contract/presets.py has no Llama-2 preset, so the shapes are written out here.
LLAMA2_7B = dict(vocab_size=32000, hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                 num_key_value_heads=32, intermediate_size=11008, tie_word_embeddings=False)
# bf16 parameters and gradients on the wire ("paper" precision); the seed does not publish its MixedPrecision.
MODEL = model_from_preset(LLAMA2_7B, "paper")
SHAPES = Shapes.of(LLAMA2_7B)
FLOPS_PER_TOKEN = flops_per_token(32000, 4096, 32, MODEL.params, SEQ)
# Latencies from NCCL's own tuning model (src/graph/tuning.cc, Ring/Simple), as docs/explaining_the_paper.py:
# 8.4 us base, then per ring step 3.4 us over NVLink and 9.6 us over the network.
BASE_ALPHA, NVLINK_STEP, NET_STEP = 8.4e-6, 3.4e-6, 9.6e-6
# NCCL's tuning model prices only a ring's node-crossing steps at the network figure: with 8 GPUs of a ring on
# each node that is 1 step in 8, the rest at NVLink's.
SPLIT_STEP = (NET_STEP + (G - 1) * NVLINK_STEP) / G
SEED = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "seed_002.md"


def seed_figures(text: str) -> tuple:
    """The seed's figures, read from its record: weak-scaling per-GPU throughput loss 128 -> 2,048 GPUs, power per
    GPU there (W), TP's words/s gain and extra power at 2,048 GPUs, best-layout MFU on A100 and H100."""
    text = " ".join(text.split())
    loss = re.search(r"words/s per device fall ([\d.]+) %", text)
    watts = re.search(r"\((\d+) → (\d+) W\)", text)
    tp = re.search(r"TP raised words/s by ([\d.]+) % for \+(\d+) W", text)
    mfu = re.search(r"MFU ([\d.]+) % → ([\d.]+) %", text)
    return (float(loss[1]) / 100, (int(watts[1]), int(watts[2])), float(tp[1]) / 100, int(tp[2]),
            (float(mfu[1]) / 100, float(mfu[2]) / 100))


SEED_WEAK_LOSS, SEED_WATTS, SEED_TP_GAIN, SEED_TP_WATTS, SEED_MFU = seed_figures(SEED.read_text())


@dataclass(frozen=True)
class Platform:
    """A DGX node's published figures. `nvlink`: the bus bandwidth NCCL reaches over NVLink (the model's link
    bandwidth is a bus bandwidth, as nccl-tests reports it), not the line rate; `nic`: one GPU's InfiniBand port."""

    name: str
    peak: float
    nvlink: float
    nic: float


# A100 SXM 80 GB: 312 TFLOP/s bf16 dense (NVIDIA A100 datasheet); NVLink-3 600 GB/s both ways = 300 GB/s per
# direction, ~200 GB/s all_reduce busbw measured (nccl-tests issues #149, #178); DGX A100: 8 x 200 Gb/s HDR
# ConnectX-6 for compute traffic (DGX A100 datasheet).
# H100 SXM 80 GB: 989 TFLOP/s bf16 dense (NVIDIA H100 datasheet); NVLink-4 900 GB/s both ways = 450 GB/s per
# direction, ~370 GB/s ring busbw after NCCL's ~20 % protocol overhead (NCCL's maintainer, nccl-tests issue #212);
# DGX H100: 8 x 400 Gb/s ConnectX-7 (DGX H100 user guide).
A100 = Platform("A100", 312e12, 200 * GB, 25 * GB)
H100 = Platform("H100", 989e12, 370 * GB, 50 * GB)


def network(hw: Platform, net_step: float = NET_STEP) -> Network:
    """NVLink inside a node; between nodes the node's 8 ports together (NCCL runs one ring channel per port;
    groups that share a node's ports divide them: the model's flows). One non-blocking switch stands for the
    fat tree, which the seed does not publish."""
    links = {"node": (hw.nvlink, NVLINK_STEP), "leaf": (G * hw.nic, net_step)}
    return Network({(level, c): Link(BASE_ALPHA, bw, step) for level, (bw, step) in links.items()
                    for c in COLLECTIVES}, f"{hw.name}: sourced NCCL alpha/beta")


@dataclass(frozen=True)
class Run:
    """One priced layout: P pipeline stages x T tensor ranks per data-parallel rank, `batch` sequences each."""

    hw: Platform
    gpus: int
    P: int
    T: int
    batch: int
    t: StepTime
    regather: float  # the model's price of the backward all_gathers, which the seed's FSDP did not issue

    def tokens_per_s(self) -> float:
        return self.gpus // (self.P * self.T) * self.batch * SEQ / self.t.step_s

    def mfu(self) -> float:
        return FLOPS_PER_TOKEN * self.tokens_per_s() / (self.gpus * self.hw.peak)

    @property
    def exposed(self) -> float:
        return max(0.0, self.t.step_s - self.t.compute_s)  # the schedule sums compute op by op: rounding below 0

    def no_regather_s(self) -> float:
        """The step without the backward all_gathers (reshard_after_forward=False, as the seed ran): the model's
        own price of them taken off the shard traffic that overlaps compute."""
        shard, compute = self.t.comm_s["shard"], self.t.compute_s
        return self.t.step_s - max(compute, shard) + max(compute, shard - self.regather)


def price(hw: Platform, gpus: int, batch: int, P: int = 1, T: int = 1, net_step: float = NET_STEP,
          overlap: bool = True, unshared: bool = False) -> Run:
    """FSDP over every data-parallel rank (F = R = 1), placed by fedshard; under PP one microbatch per sequence
    (the plan's choice). `unshared`: groups inside one node do not divide NVLink (an NVSwitch gives each GPU its
    own links), where the model divides it by the node's concurrent groups."""
    S, nodes = gpus // (P * T), gpus // G
    topo = topology.ideal(nodes, [1, nodes]).with_bandwidth([hw.nvlink, hw.nic], "seed 002")
    layout = Layout("fsdp", 1, 1, S, P=P, T=T)
    loads, net = load(place(layout, G, topo), layout, topo), network(hw, net_step)
    if unshared:
        loads = {kind: ({-1: 1} if set(lv) == {-1} else lv) for kind, lv in loads.items()}
    acts = Activations(batch if P > 1 else 1, batch * SEQ, 4096, 32000)
    t = step_time(layout, SHAPES, MODEL, Links(net, loads),
                  Compute.estimated(LLAMA2_7B, batch, SEQ, hw.peak), overlap=overlap, acts=acts)
    # this page reads the full-overlap bound as the estimate (the seed's FSDP prefetched explicitly and kept layers
    # gathered), not the step schedule fedshard's plan now uses (launcher.placement.schedule)
    t = replace(t, step_s=t.full_overlap_s if overlap else t.no_overlap_s)
    regather = -(-SHAPES.layers // P) * net.seconds("all_gather", SHAPES.layer / T * MODEL.bytes_per_param, S,
                                                    loads["shard"])
    return Run(hw, gpus, P, T, batch, t, regather)


def layouts(gpus: int, global_batch: int) -> list[tuple[int, int, int]]:
    """(P, T, sequences per data-parallel rank) the trainer accepts: TP inside a node, a whole number of
    sequences per rank, at least P of them under PP (train.microbatches >= pp)."""
    return [(P, T, global_batch * P * T // gpus) for T in (1, 2, 4, 8) for P in (1, 2, 4, 8, 16)
            if gpus % (P * T) == 0 and global_batch % (gpus // (P * T)) == 0
            and global_batch * P * T // gpus >= P]


def name(P: int, T: int) -> str:
    return "FSDP" + (f" + TP {T}" if T > 1 else "") + (f" + PP {P}" if P > 1 else "")


def weak_table() -> tuple[str, list[float], float]:
    """FSDP at 2 sequences per GPU, 2 to 256 nodes on H100; per-GPU throughput relative to 128 GPUs (the tokens
    per GPU are fixed, so it is the inverse ratio of the steps) under each reading of the model."""
    lines = ["**A. Weak scaling: FSDP, 2 x 4,096 tokens per GPU, DGX H100**", "",
             "| GPUs | nodes | compute (s) | shard comm (s) | of it latency (s) | of it backward re-gather (s) "
             "| no overlap (s) | full overlap = estimate (s) | exposed comm (s) | tokens/s per GPU | vs 128 GPUs "
             "| no overlap, vs 128 | without re-gather, vs 128 | NCCL latency split, vs 128 |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    free = Platform("H100", H100.peak, 1e30, 1e30)  # infinite bandwidth: what is left is latency
    runs = {g: price(H100, g, 2) for g in (16, 32, 64, 128, 256, 512, 1024, 2048)}
    steps = {g: (r.t.step_s, r.t.no_overlap_s, r.no_regather_s(), price(H100, g, 2, net_step=SPLIT_STEP).t.step_s)
             for g, r in runs.items()}
    for g, r in runs.items():
        lines.append(f"| {g:,} | {g // G} | {r.t.compute_s:.3f} | {r.t.comm_s['shard']:.3f} | "
                     f"{price(free, g, 2).t.comm_s['shard']:.3f} | {r.regather:.3f} | {r.t.no_overlap_s:.3f} | "
                     f"{r.t.step_s:.3f} | {r.exposed:.3f} | {r.tokens_per_s() / g:,.0f} | "
                     + " | ".join(f"{b / s - 1:+.1%}" for s, b in zip(steps[g], steps[128])) + " |")
    split = price(H100, 2048, 2, net_step=SPLIT_STEP).t.comm_s["shard"]  # NCCL's split at 2,048 GPUs
    return "\n".join(lines), [b / s - 1 for s, b in zip(steps[2048], steps[128])], split


def strong_table() -> tuple[str, float]:
    """Global batch 32 sequences, 2 to 32 nodes: FSDP where every GPU gets a whole sequence, and the fastest
    layout the trainer accepts, as the model prices NVLink and with groups inside a node unshared; returns the
    table and the best MFU at 32 nodes."""
    lines = ["**B. Strong scaling: global batch 32 x 4,096 tokens, DGX H100**", "",
             "| nodes | GPUs | sequences per GPU | FSDP: step (s) | FSDP: MFU | best layout "
             "| sequences per data-parallel rank | step (s) | exposed comm (s) | MFU | best, NVLink unshared | MFU "
             "| seed's MFU |",
             "|---:|---:|---:|---:|---:|:---|---:|---:|---:|---:|:---|---:|:---|"]
    seed = {2: "40 %", 32: "under 15 %"}
    for nodes in (2, 4, 8, 16, 32):
        g = nodes * G
        runs = [price(H100, g, b, P, T) for P, T, b in layouts(g, 32)]
        fsdp = next((r for r in runs if r.P * r.T == 1), None)
        best = max(runs, key=Run.tokens_per_s)
        alt = max((price(H100, g, b, P, T, unshared=True) for P, T, b in layouts(g, 32)), key=Run.tokens_per_s)
        head = f"{fsdp.t.step_s:.3f} | {fsdp.mfu():.1%}" if fsdp else "impossible | -"
        lines.append(f"| {nodes} | {g} | {32 / g:g} | {head} | {name(best.P, best.T)} | {best.batch} | "
                     f"{best.t.step_s:.3f} | {best.exposed:.3f} | {best.mfu():.1%} | {name(alt.P, alt.T)} | "
                     f"{alt.mfu():.1%} | {seed.get(nodes, '-')} |")
    return "\n".join(lines), best.mfu()  # the last size: 32 nodes


def parallel_table(title: str, gpus: int, global_batch: int) -> tuple[str, dict]:
    """FSDP against TP 2-8 and PP 2-16 (each with FSDP over the data-parallel ranks) at one global batch."""
    lines = [f"**{title}**", "",
             "| layout | data-parallel ranks | sequences per rank | microbatches | compute incl. bubble (s) "
             "| shard comm (s) | tensor comm (s) | pipeline comm (s) | step (s) | exposed comm (s) | MFU "
             "| throughput vs FSDP | NVLink unshared: tensor comm (s) | vs FSDP |",
             "|:---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    runs = {(P, T): (price(H100, gpus, b, P, T), price(H100, gpus, b, P, T, unshared=True))
            for P, T, b in layouts(gpus, global_batch) if P == 1 or T == 1}
    gain = {}
    for (P, T), (r, u) in runs.items():
        c = r.t.comm_s
        gain[(P, T)] = [x.tokens_per_s() / f.tokens_per_s() - 1 for x, f in zip((r, u), runs[(1, 1)])]
        lines.append(f"| {name(P, T)} | {gpus // (P * T):,} | {r.batch} | {r.batch if P > 1 else 1} | "
                     f"{r.t.compute_s:.3f} | {c['shard']:.3f} | {c.get('tensor', 0):.3f} | {c.get('pipeline', 0):.3f} "
                     f"| {r.t.step_s:.3f} | {r.exposed:.3f} | {r.mfu():.1%} | {gain[(P, T)][0]:+.1%} | "
                     f"{u.t.comm_s.get('tensor', 0):.3f} | {gain[(P, T)][1]:+.1%} |")
    lines.append("| FSDP + TP 16 | - | - | - | - | - | - | - | - | - | - | not priced: TP across nodes is refused "
                 "| - | - |")
    return "\n".join(lines), gain


def platform_table() -> str:
    """The same layout on each platform (FSDP, 2 sequences per GPU), then each platform's fastest of C2's."""
    lines = ["**D. A100 against H100: FSDP, 2 x 4,096 tokens per GPU, each platform's own figures**", "",
             "| GPUs | A100: shard comm (s) | A100: step (s) | A100: exposed comm (s) | A100: exposed share "
             "| A100: MFU | H100: shard comm (s) | H100: step (s) | H100: exposed comm (s) | H100: exposed share "
             "| H100: MFU | MFU change | exposed share change (points) |",
             "|:---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    pairs = [(f"{g:,}", price(A100, g, 2), price(H100, g, 2)) for g in (16, 128, 256, 1024, 2048)]
    best = [max((price(hw, 2048, b, P, T) for P, T, b in layouts(2048, 4096) if P == 1 or T == 1),
                key=Run.tokens_per_s) for hw in (A100, H100)]
    pairs.append((f"2,048, fastest of C2 ({name(best[0].P, best[0].T)}; {name(best[1].P, best[1].T)})", *best))
    for label, a, h in pairs:
        sa, sh = a.exposed / a.t.step_s, h.exposed / h.t.step_s
        lines.append(f"| {label} | {a.t.comm_s['shard']:.3f} | {a.t.step_s:.3f} | {a.exposed:.3f} | {sa:.1%} | "
                     f"{a.mfu():.1%} | {h.t.comm_s['shard']:.3f} | {h.t.step_s:.3f} | {h.exposed:.3f} | {sh:.1%} | "
                     f"{h.mfu():.1%} | "
                     f"{round(h.mfu() / a.mfu() - 1, 6) + 0.0:+.1%} | {100 * (sh - sa):+.1f} |")
    return "\n".join(lines)


def main() -> None:
    compute = Compute.estimated(LLAMA2_7B, 2, SEQ, H100.peak)
    seconds = compute.forward_s + compute.backward_s
    print(f"Llama-2 7B: {MODEL.params:,} parameters, {FLOPS_PER_TOKEN / 1e9:.1f} GFLOP per token at context "
          f"{SEQ:,}; 2 sequences per GPU at {ASSUMED_MFU:.0%} MFU: {seconds:.3f} s of compute per step on an H100, "
          f"{seconds * H100.peak / A100.peak:.3f} s on an A100.")
    print()
    table, weak, split = weak_table()
    print(table)
    print()
    print(f"Per-GPU throughput from 128 to 2,048 GPUs: estimate {weak[0]:+.2%}, no overlap {weak[1]:+.2%}, without "
          f"the backward re-gather {weak[2]:+.2%}, NCCL latency split {weak[3]:+.2%} (its shard comm at 2,048 GPUs: "
          f"{split:.3f} s, under the {seconds:.3f} s of compute); seed {-SEED_WEAK_LOSS:+.2%}; residual of the "
          f"estimate (predicted - seed) {100 * (weak[0] + SEED_WEAK_LOSS):+.2f} points.")
    layer = [price(H100, 2048, 2, net_step=step).regather / SHAPES.layers for step in (NET_STEP, SPLIT_STEP)]
    print(f"One layer's all_gather on 2,048 ranks costs {1e3 * layer[0]:.2f} ms at {1e6 * NET_STEP:.1f} us per ring "
          f"step, {1e3 * layer[1]:.2f} ms with NCCL's split ({1e6 * SPLIT_STEP:.3f} us per step on average).")
    print()
    table, strong = strong_table()
    print(table)
    gains = {}
    for key, title, gpus, batch in (
            (256, "C1. Model parallelism at 32 nodes (256 GPUs), global batch 512, DGX H100", 256, 512),
            (2048, "C2. Model parallelism at 2,048 GPUs, global batch 4,096 (2 per GPU), DGX H100", 2048, 4096)):
        table, gains[key] = parallel_table(title, gpus, batch)
        print()
        print(table)
    print()
    print(f"TP 2 / TP 4 over FSDP: at 256 GPUs {gains[256][(1, 2)][0]:+.1%} / {gains[256][(1, 4)][0]:+.1%}, at "
          f"2,048 GPUs {gains[2048][(1, 2)][0]:+.1%} / {gains[2048][(1, 4)][0]:+.1%} (NVLink unshared: "
          f"{gains[256][(1, 2)][1]:+.1%} / {gains[256][(1, 4)][1]:+.1%} and {gains[2048][(1, 2)][1]:+.1%} / "
          f"{gains[2048][(1, 4)][1]:+.1%}); seed: TP or PP of 2 or 4 faster than FSDP at 256 GPUs, TP "
          f"{SEED_TP_GAIN:+.2%} words/s at 2,048 GPUs.")
    print()
    print(platform_table())
    print()
    print(f"Seed, each platform's best layout: MFU {SEED_MFU[0]:.2%} (A100) -> {SEED_MFU[1]:.2%} (H100), "
          f"{SEED_MFU[1] / SEED_MFU[0] - 1:+.2%}; exposed communication +12.83 %.")
    print()
    watts = SEED_WATTS[1] / SEED_WATTS[0]
    print(f"E. Power is not predicted. At the seed's measured {SEED_WATTS[0]} -> {SEED_WATTS[1]} W per GPU "
          f"({watts - 1:+.2%}), tokens per joule from 128 to 2,048 GPUs change by "
          f"{(1 - SEED_WEAK_LOSS) / watts - 1:+.2%} with the seed's measured throughput, "
          f"{(1 + weak[0]) / watts - 1:+.2%} with the model's estimate.")
    tp, tp_watts = max(gains[2048][(1, 2)][0], gains[2048][(1, 4)][0]), SEED_WATTS[1] / (SEED_WATTS[1] + SEED_TP_WATTS)
    print(f"TP at 2,048 GPUs, +{SEED_TP_WATTS} W over {SEED_WATTS[1]} W (assumed: the seed does not say FSDP drew "
          f"{SEED_WATTS[1]} W in that comparison): tokens per joule {(1 + SEED_TP_GAIN) * tp_watts - 1:+.2%} with the "
          f"seed's {SEED_TP_GAIN:+.2%}, {(1 + tp) * tp_watts - 1:+.2%} with the model's best TP gain ({tp:+.1%}).")
    print()
    points = [100 * (w + SEED_WEAK_LOSS) for w in weak]
    tp_points = [100 * (gains[2048][(1, T)][0] - SEED_TP_GAIN) for T in (2, 4)]
    print(f"Residuals, predicted - seed, in points: weak-scaling throughput change {points[0]:+.2f} (no overlap "
          f"{points[1]:+.2f}, without re-gather {points[2]:+.2f}, NCCL latency split {points[3]:+.2f}); "
          f"strong-scaling MFU at 2 nodes {100 * ASSUMED_MFU - 40:+.1f} (by assumption), at 32 nodes at least "
          f"{100 * strong - 15:+.1f}; TP 2 / TP 4 gain at 2,048 GPUs {tp_points[0]:+.1f} / {tp_points[1]:+.1f}; "
          f"A100 MFU {100 * (price(A100, 2048, 2).mfu() - SEED_MFU[0]):+.2f}; tokens per joule 128 -> 2,048 GPUs "
          f"{100 * (weak[0] + SEED_WEAK_LOSS) / watts:+.1f}.")

if __name__ == "__main__":
    main()
