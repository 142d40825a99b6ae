"""The paper's per-batch communication cost model (NCCL ring) and the size of a checkpoint (ranking.py ranks layouts).

Pure arithmetic, no torch: `plan` must stay fast. Every strategy is one grid F x R x S, so one function
prices them all; the strategy only decides which of three terms exist:

- shard       3(S-1)/(S*B_S)                      all-gather x2 + reduce-scatter every step
- replicate   2(R-1)/(R*B_R)                      gradient all-reduce across replicas every step
- federation  (1/A)*(2(F-1)/(F*B_F) + 1/B_R)      FedAvg all-reduce across groups every A steps, then
                                                  replica 0's broadcast to the other R-1 (FL+HSDP only)

each multiplied by M*L = the model's bytes as each collective sends them (`Model`): the shard term is
P*(2*b_gather + b_grad)*(S-1)/(S*B_S), the replicate term P*b_grad*..., the federation term P*b_fedavg*...;
with one dtype throughout these are the paper's 3*M*L, 2*M*L, M*L. A group of size 1 sends nothing, so its
term is 0 and its bandwidth may be None; that includes the broadcast when R = 1, and the whole federation
term when F = 1.
"""
from __future__ import annotations

from dataclasses import dataclass

from train.contract.layout import Layout
from train.contract.spec import INT8_BLOCK  # torch-free

LLAMA_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
               "num_key_value_heads", "intermediate_size")


def llama_params(vocab_size: int, hidden_size: int, num_hidden_layers: int, num_attention_heads: int,
                 num_key_value_heads: int, intermediate_size: int, tie_word_embeddings: bool = False) -> int:
    """Exact parameter count of a HF LlamaForCausalLM (no biases), without building one."""
    kv = hidden_size // num_attention_heads * num_key_value_heads
    attention = 2 * hidden_size * hidden_size + 2 * hidden_size * kv  # q, o; k, v
    layer = attention + 3 * hidden_size * intermediate_size + 2 * hidden_size  # gate/up/down; 2 RMSNorms
    embeddings = vocab_size * hidden_size * (1 if tie_word_embeddings else 2)  # embed_tokens (+ lm_head)
    return embeddings + num_hidden_layers * layer + hidden_size  # + final norm


@dataclass(frozen=True)
class Model:
    """What the cost model needs of a model: its parameters and the bytes per parameter each collective sends.

    bytes_per_param: FSDP's parameter all-gathers (compute dtype); grad_bytes_per_param: the gradient
    reduce-scatter and the replicas' all-reduce (reduce dtype); fedavg_bytes_per_param: FedAvg's exchange of
    the stored parameters (and AdamW moments when those are averaged too), or of the pseudo-gradients in
    train.aggregation_dtype. None = bytes_per_param.
    """
    params: int
    layers: int
    bytes_per_param: int
    grad_bytes_per_param: int | None = None
    fedavg_bytes_per_param: float | None = None

    @property
    def bytes(self) -> int:
        return self.params * self.bytes_per_param

    @property
    def grad_bytes(self) -> int:
        return self.params * (self.grad_bytes_per_param or self.bytes_per_param)

    @property
    def fedavg_bytes(self) -> float:
        return self.params * (self.fedavg_bytes_per_param or self.bytes_per_param)


# (all-gather, gradient reduction, FedAvg) bytes per parameter, as train.parallel.parallelize and
# train.federation.federated send them: fp32 everywhere; bf16 = bf16 all-gathers over fp32 master weights with fp32
# gradient reduction; paper = bf16 parameters, gradients and optimizer state (the authors' FSDP MixedPrecision reduces
# in bf16).
WIRE_BYTES = {"fp32": (4, 4, 4), "bf16": (2, 4, 4), "paper": (2, 2, 2)}
REDUCE_WIRE_BYTES = {"fp32": 4, "bf16": 2}  # train.reduce_dtype, where the run names it
# Bytes per value of a compressed exchange (train.federation.compress): int8 adds one fp32 scale per block.
COMPRESSED_BYTES = {"bf16": 2, "int8": 1 + 4 / INT8_BLOCK}


def model_from_preset(preset_kwargs: dict, precision: str, average_optimizer_state: bool = False,
                      aggregation_dtype: str = "fp32", reduce_dtype: str | None = None) -> Model:
    """A Model from LlamaConfig kwargs and the run's precision; averaging AdamW's two moments (stored like
    the parameters) triples what FedAvg sends; a compressed exchange sends COMPRESSED_BYTES per parameter. The
    gradients travel in `reduce_dtype` (train.reduce_dtype) when given, else as WIRE_BYTES says."""
    missing = [key for key in LLAMA_KEYS if key not in preset_kwargs]
    if missing:
        raise ValueError(f"model preset lacks {', '.join(missing)}")
    params = llama_params(**{key: preset_kwargs[key] for key in LLAMA_KEYS},
                          tie_word_embeddings=preset_kwargs.get("tie_word_embeddings", False))
    gather, grad, fedavg = WIRE_BYTES[precision]
    grad = REDUCE_WIRE_BYTES[reduce_dtype] if reduce_dtype is not None else grad
    fedavg = COMPRESSED_BYTES.get(aggregation_dtype, fedavg * (3 if average_optimizer_state else 1))
    return Model(params, preset_kwargs["num_hidden_layers"], gather, grad, fedavg)


def _bandwidth(key: str, value: float | None) -> float:
    """A bandwidth a non-trivial group needs: present and positive, else one line naming it."""
    if value is None or value <= 0:
        raise ValueError(f"{key} must be a positive bandwidth in bytes/s, got {value!r}")
    return value


def _terms(layout: Layout, model: Model, B_S: float | None, B_R: float | None,
           B_F: float | None) -> dict[str, float]:
    """Seconds per batch of each term; fsdp/hsdp/fl_fsdp are fl_hsdp with F = 1 and/or R = 1 pinned (a Layout is
    checked when made: its strategy, grid and A are valid)."""
    F, R, S, A = layout.F, layout.R, layout.S, layout.A
    shard = (S - 1) / (S * _bandwidth("B_S", B_S)) if S > 1 else 0.0
    replicate = 2 * (R - 1) / (R * _bandwidth("B_R", B_R)) if R > 1 else 0.0
    federation = 0.0
    if F > 1:
        broadcast = 1 / _bandwidth("B_R", B_R) if R > 1 else 0.0
        federation = (2 * (F - 1) / (F * _bandwidth("B_F", B_F)) + broadcast) / A
    return {"shard": (2 * model.bytes + model.grad_bytes) * shard, "replicate": model.grad_bytes * replicate,
            "federation": model.fedavg_bytes * federation}


def comm_time(layout: Layout, model: Model, B_S: float | None, B_R: float | None, B_F: float | None) -> float:
    """Predicted communication seconds per optimizer step (the paper's C_FSDP ... C_FL+HSDP)."""
    return sum(_terms(layout, model, B_S, B_R, B_F).values())


def predict(layout: Layout, model: Model, bandwidth: dict) -> dict:
    """comm_time with its split by term, from {"B_S", "B_R", "B_F"} (absent = None), for reports."""
    terms = _terms(layout, model, *(bandwidth.get(key) for key in ("B_S", "B_R", "B_F")))
    return {"predicted_comm_s": sum(terms.values()), "terms": terms}


def checkpoint_bytes(params: int, F: int, precision: str, average_optimizer_state: bool = False,
                     at_fedavg: bool = True) -> int:
    """Bytes of one checkpoint (train.runtime.checkpoint): the stored parameters once, as FedAvg has just made the
    groups equal, and AdamW's two moments (stored like the parameters) once per federation group unless they
    are averaged too. A stop between two averagings (at_fedavg=False) stores the parameters per group as well.
    Parameters are stored in fp32 except under `paper` (bf16); RNG, schedule and step counters add a few KB."""
    stored = 2 if precision == "paper" else 4
    moments = 1 if average_optimizer_state else F
    return params * stored * ((1 if at_fedavg else F) + 2 * moments)
