"""Single-process reference: F plain models, each trained on its group's global batch, FedAvg every A steps."""
from __future__ import annotations

import copy

import torch

from train import data, optim
from train import model as models
from train.spec import RunSpec


class Reference:
    def __init__(self, spec: RunSpec):
        self.spec, cfg = spec, spec.train
        config = models.llama_config(spec.model)
        self.source = data.build_source(spec.data, config.vocab_size, cfg.seq_len, cfg.seed)
        torch.manual_seed(cfg.seed)
        base = models.build(config, "cpu")
        self.models = [copy.deepcopy(base) for _ in range(spec.F)]
        self.optimizers = [optim.adamw(m.parameters(), cfg) for m in self.models]
        self.schedules = [optim.schedule(o, cfg) for o in self.optimizers]

    def step(self, i: int) -> None:
        spec, cfg = self.spec, self.spec.train
        group = spec.R * spec.S
        for f, (m, opt, sched) in enumerate(zip(self.models, self.optimizers, self.schedules)):
            ids = torch.cat([self.source.train_batch(rank, i, cfg.batch_per_rank, cfg.seq_len)
                             for rank in range(f * group, (f + 1) * group)])
            m(input_ids=ids, labels=ids).loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            sched.step()
        if spec.federated and (i + 1) % spec.A == 0:
            self.average()

    @torch.no_grad()
    def average(self) -> None:
        groups = [list(zip(*(m.parameters() for m in self.models)))]
        if self.spec.train.average_optimizer_state:
            for key in ("exp_avg", "exp_avg_sq"):
                groups.append([tuple(o.state[p][key] for o, p in zip(self.optimizers, ps)) for ps in groups[0]])
        for tensors in (ts for group in groups for ts in group):
            mean = sum(tensors) / len(tensors)
            for t in tensors:
                t.copy_(mean)
