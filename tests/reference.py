"""Single-process reference: F plain models, each trained on its group's global batch, FedAvg every A steps.

With train.outer=diloco, DiLoCo's Nesterov outer step in its textbook form; with aggregation_dtype=bf16, the
pseudo-gradients rounded to bf16 before and after their fp32 mean, as train.federation.compress sends them; streamed
(outer_fragments, outer_delay), one fragment launched every A/N steps and merged τ steps later, local
progress kept."""
from __future__ import annotations

import copy

import torch

from train import model as models
from train import optim
from train.contract.spec import RunSpec
from train.data import sources as data
from train.federation.outer import split


class Reference:
    def __init__(self, spec: RunSpec):
        self.spec, cfg = spec, spec.train
        config = models.llama_config(spec.model)
        self.source = data.build_source(spec.data, config.vocab_size, cfg.seq_len, cfg.seed)
        torch.manual_seed(cfg.seed)
        base = models.build(config, "cpu")
        self.models = [copy.deepcopy(base) for _ in range(spec.layout.F)]
        self.optimizers = [optim.adamw(m.parameters(), cfg) for m in self.models]
        self.schedules = [optim.schedule(o, cfg) for o in self.optimizers]
        self.synced = [p.detach().clone() for p in base.parameters()]
        self.momentum = [torch.zeros_like(p) for p in self.synced]
        if spec.federated:
            self.fragments = split([p.numel() for p in self.synced], cfg.outer_fragments)
            self.period = spec.layout.A // cfg.outer_fragments
        self.pending = None  # (tensor indices, every group's pseudo-gradients, the step it lands after)

    def group_batch(self, f: int, i: int) -> torch.Tensor:
        """Step i's sequences of federation group f: its slice of the global batch."""
        spec = self.spec
        b = spec.layout.R * spec.layout.S * spec.train.batch_per_rank
        return self.source.train_batch(i, range(f * b, (f + 1) * b), data.global_batch(spec), spec.train.seq_len)

    def step(self, i: int) -> list[float]:
        """Step i of every group; each group's loss on its global batch (before the step's update)."""
        spec, cfg = self.spec, self.spec.train
        losses = []
        for f, (m, opt, sched) in enumerate(zip(self.models, self.optimizers, self.schedules)):
            ids = self.group_batch(f, i)
            loss = m(input_ids=ids, labels=ids).loss
            loss.backward()
            losses.append(loss.item())
            if cfg.max_norm:
                torch.nn.utils.clip_grad_norm_(m.parameters(), cfg.max_norm)
            opt.step()
            opt.zero_grad(set_to_none=True)
            sched.step()
        if not spec.federated:
            return losses
        done = i + 1
        if not cfg.streamed:
            if done % spec.layout.A == 0:
                self.average()
            return losses
        if self.pending is not None and self.pending[2] == done:
            self._land()
        if done % self.period == 0:
            self._launch(self.fragments[(done // self.period - 1) % len(self.fragments)], done + cfg.outer_delay)
            if not cfg.outer_delay:
                self._land()
        return losses

    @torch.no_grad()
    def average(self) -> None:
        groups = [list(zip(*(m.parameters() for m in self.models)))]
        if self.spec.train.average_optimizer_state:
            for key in ("exp_avg", "exp_avg_sq"):
                groups.append([tuple(o.state[p][key] for o, p in zip(self.optimizers, ps)) for ps in groups[0]])
        cfg = self.spec.train
        plain = cfg.outer == "fedavg" and cfg.aggregation_dtype == "fp32"
        for tensors in (ts for group in (groups if plain else groups[1:]) for ts in group):
            mean = sum(tensors) / len(tensors)
            for t in tensors:
                t.copy_(mean)
        if not plain:
            self._launch(list(range(len(self.synced))), None)
            self._land()

    def _launch(self, indices: list[int], lands_after: int | None) -> None:
        params = [list(m.parameters()) for m in self.models]
        self.pending = (indices, {i: [self.synced[i] - ps[i].detach() for ps in params] for i in indices}, lands_after)

    @torch.no_grad()
    def _land(self) -> None:
        cfg = self.spec.train
        indices, own, _ = self.pending
        self.pending = None
        lr, mu = (cfg.outer_lr, cfg.outer_momentum) if cfg.outer == "diloco" else (1.0, 0.0)
        wire = torch.bfloat16 if cfg.aggregation_dtype == "bf16" else torch.float32  # int8: not emulated
        params = [list(m.parameters()) for m in self.models]
        for i in indices:
            sent = [d.to(wire).float() for d in own[i]]
            delta = (sum(sent) / len(sent)).to(wire).float()  # the mean of the groups' pseudo-gradients
            self.momentum[i].mul_(mu).add_(delta)
            new = self.synced[i] - lr * (delta + mu * self.momentum[i])
            for ps, mine in zip(params, own[i]):
                if cfg.outer_delay:  # keep what the steps since the launch changed: + new - (synced - own)
                    ps[i].add_(new - self.synced[i] + mine)
                else:
                    ps[i].copy_(new)
            self.synced[i] = new
