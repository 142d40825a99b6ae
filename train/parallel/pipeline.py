"""Pipeline parallelism: a Llama cut into P stages of consecutive layers, run by torch.distributed.pipelining.

A stage keeps the whole model's parameter names (layers in a ModuleDict under their own indices), so FedAvg's
alignment guard, checkpoints and per-shard initialisation see the same names with or without stages. The first
stage holds the embedding, the last the final norm and lm_head; each keeps the rotary embedding (no weights).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
from transformers.masking_utils import create_causal_mask

from train.model import ForCausalLMLoss

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}


def stage_layers(layers: int, stages: int, stage: int) -> range:
    """Layers split evenly; the first stages take one more when they do not divide (they hold no lm_head)."""
    base, extra = divmod(layers, stages)
    start = stage * base + min(stage, extra)
    return range(start, start + base + (stage < extra))


class Stage(nn.Module):
    """Stage `stage` of `stages` of a LlamaForCausalLM: ids (first stage) or hidden states in, hidden states or
    logits (last stage) out, computed as LlamaModel.forward computes them."""

    def __init__(self, full: nn.Module, stage: int, stages: int):
        super().__init__()
        self.config, self.first, self.last = full.config, stage == 0, stage == stages - 1
        self._full = [full]  # its weight initialisation, for meta init (a list: not a submodule)
        self.model = nn.Module()
        self.model.embed_tokens = full.model.embed_tokens if self.first else None
        self.model.layers = nn.ModuleDict({str(i): full.model.layers[i]
                                           for i in stage_layers(self.config.num_hidden_layers, stages, stage)})
        self.model.norm = full.model.norm if self.last else None
        self.model.rotary_emb = full.model.rotary_emb
        self.lm_head = full.lm_head if self.last else None

    def initialize_weights(self) -> None:
        """The whole model's initialisation, applied to this stage's modules only."""
        for module in self.modules():
            self._full[0]._initialize_weights(module)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.model.embed_tokens(x) if self.first else x
        positions = torch.arange(h.shape[1], device=h.device).unsqueeze(0)
        # no position ids: given them without a cache, transformers looks for packed sequences, reading the device
        # every microbatch (train.job.dryrun found it); these positions are one sequence per row
        mask = create_causal_mask(config=self.config, inputs_embeds=h, attention_mask=None, cache=None)
        rotary = self.model.rotary_emb(h, position_ids=positions)
        for layer in self.model.layers.values():
            h = layer(h, attention_mask=mask, position_embeddings=rotary, position_ids=positions)
        return self.lm_head(self.model.norm(h)) if self.last else h


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The decoder layers a model or stage holds, in order."""
    layers = model.model.layers
    return list(layers.values()) if isinstance(layers, nn.ModuleDict) else list(layers)


def boundary_shapes(stage: Stage, microbatch: tuple[int, int], dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """What a stage receives and sends for one microbatch, as meta tensors: token ids or hidden states in, hidden
    states or logits out (whole: tensor parallelism gathers both at the boundary, train.parallel.tensor). Given up
    front, the schedule needs no shape exchange at its first step (pickled objects sent between stages, and host
    reads)."""
    n, tokens = microbatch
    hidden = (n, tokens, stage.config.hidden_size)
    ids = torch.empty(n, tokens, dtype=torch.int64, device="meta")
    inputs = ids if stage.first else torch.empty(hidden, dtype=dtype, device="meta", requires_grad=True)
    out = (n, tokens, stage.config.vocab_size) if stage.last else hidden  # gradients flow back through both
    return inputs, torch.empty(out, dtype=dtype, device="meta", requires_grad=True)


class Pipeline:
    """One rank's stage under a GPipe or 1F1B schedule over the pipeline group of `mesh`."""

    def __init__(self, stage: Stage, mesh: DeviceMesh, microbatches: int, schedule: str, device: str, batch: int,
                 seq_len: int, precision: str):
        """`batch`: the sequences of one step, split into `microbatches`."""
        self.stage_module, self.device = stage, device
        self.group = mesh.get_group("pp")
        self.index, self.stages = mesh["pp"].get_local_rank(), mesh["pp"].size()
        dtype = torch.float32 if precision == "fp32" else torch.bfloat16  # a layer's output (parallelize)
        inputs, outputs = boundary_shapes(stage, (batch // microbatches, seq_len), dtype)
        self.stage = PipelineStage(stage, self.index, self.stages, torch.device(device), input_args=inputs,
                                   output_args=outputs, group=self.group)
        vocab = stage.config.vocab_size
        self.schedule = SCHEDULES[schedule](self.stage, microbatches,
                                            loss_fn=lambda logits, ids: ForCausalLMLoss(logits, ids, vocab))

    def step(self, ids: torch.Tensor) -> torch.Tensor:
        """Forward and backward of one batch in microbatches; the last stage returns the batch's mean loss (the
        microbatches hold equally many predicted tokens), the others 0."""
        losses: list[torch.Tensor] = []
        inputs = (ids,) if self.stage_module.first else ()
        self.schedule.step(*inputs, target=ids if self.stage_module.last else None, losses=losses,
                           return_outputs=False)  # the logits are not needed: do not keep every microbatch's
        if not self.stage_module.last:
            return torch.zeros((), device=self.device)
        return torch.stack([loss.detach() for loss in losses]).mean()

    @torch.no_grad()
    def loss(self, ids: torch.Tensor) -> torch.Tensor | None:
        """The mean loss of one evaluation batch, passed stage to stage without a schedule (evaluation batches
        vary in size); the last stage returns it, the others None."""
        h = ids if self.stage_module.first else self._receive(ids)
        out = self.stage_module(h)
        if not self.stage_module.last:
            dist.send(out.float().contiguous(), group=self.group, group_dst=self.index + 1)
            return None
        return ForCausalLMLoss(out, ids, self.stage_module.config.vocab_size)

    def _receive(self, ids: torch.Tensor) -> torch.Tensor:
        h = torch.empty(*ids.shape, self.stage_module.config.hidden_size, device=self.device)
        dist.recv(h, group=self.group, group_src=self.index - 1)
        return h.to(next(self.stage_module.parameters()).dtype)  # sent as fp32: exact for bf16 too
