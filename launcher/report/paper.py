"""The paper's published Tables 3-4 and its 512-GPU layouts, so a report can set a matching run beside them."""
from __future__ import annotations

from train.contract.layout import STRATEGIES

LLAMA3_8B_PARAMS = 8_030_261_248
PAPER_A = 8
NAMES = {name: row.label for name, row in STRATEGIES.items()}
LAYOUTS = {"fsdp": (1, 1, 512), "hsdp": (1, 128, 4), "fl_fsdp": (128, 1, 4), "fl_hsdp": (16, 8, 4)}  # (F, R, S)

# Seconds and perplexities; phases are per-step means, aggregation too: (mean, std) over all steps, most
# of which do not average (about 1/A of an event: ~1.36 s per FedAvg for FL+FSDP at A = 8).
# "≈" values are taken at face value; HSDP backward is the paper's derived 0.89 × 1.61; None = not published.
TABLES = {
    "fsdp": {"train_time_s": 770.54, "train_ppl": 496.00, "eval_ppl": 486.64,
             "forward": 4.53, "backward": 7.50, "aggregation": None},
    "hsdp": {"train_time_s": 117.37, "train_ppl": 1151.47, "eval_ppl": 1145.78,
             "forward": 0.37, "backward": 1.43, "aggregation": None},
    "fl_fsdp": {"train_time_s": 95.87, "train_ppl": 403.29, "eval_ppl": 436.65,
                "forward": 0.37, "backward": 0.89, "aggregation": (0.17, 0.55)},
    "fl_hsdp": {"train_time_s": 101.04, "train_ppl": 254.31, "eval_ppl": 255.81,
                "forward": 0.38, "backward": None, "aggregation": (0.14, 0.54)},
}


def reproduces_paper(result: dict) -> bool:
    """True for Llama-3.1-8B in the paper's layout for its strategy (and A = 8 for the FL strategies)."""
    strategy = result.get("strategy")
    if result.get("params") != LLAMA3_8B_PARAMS or strategy not in LAYOUTS:
        return False
    if (result.get("F"), result.get("R"), result.get("S")) != LAYOUTS[strategy]:
        return False
    return not STRATEGIES[strategy].federated or result.get("A") == PAPER_A
