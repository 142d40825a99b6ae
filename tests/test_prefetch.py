"""train.prefetch=false (issue 54, item 5): FSDP2 as the paper's FSDP1 ran, no all-gather issued before its unit is
reached. On real gloo ranks it trains bitwise like the default (the same losses) and issues the same collectives;
only when they are issued changes: by default the next unit's backward all-gather is prefetched before this unit's
reduce-scatter, without prefetch it comes after. The dry-run counts the same collectives either way."""
import torch

from tests.support import run_ranks
from train.contract.spec import RunSpec
from train.job.dryrun import Watch, dryrun, group_names


class _Order(Watch):
    """Watch's counts, and the order of the shard group's all-gathers (G) and reduce-scatters (R)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.order: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name.split("::")[-1]
        if func.namespace == "c10d" and name in ("_allgather_base_", "_reduce_scatter_base_"):
            self.order.append("G" if "allgather" in name else "R")
        return super().__torch_dispatch__(func, types, args, kwargs)


def _train_rank(rank: int, world: int, raw: dict) -> dict:
    from train.loop import Trainer
    from train.parallel.parallelize import local

    trainer = Trainer(RunSpec.from_dict(raw), rank, "cpu")
    watch = _Order(group_names(trainer.mesh), fake=False)
    watch.strict = False
    with watch:
        trainer.run("gloo")
    return {"losses": [r["loss"] for r in trainer.log.rows], "order": "".join(watch.order),
            "collectives": watch.report()["collectives"],
            "params": [local(p).detach().clone() for p in trainer.model.parameters()]}


def _spec(tmp_path, prefetch: bool, steps: int = 3) -> dict:
    return {"strategy": "fsdp", "F": 1, "R": 1, "S": 2, "model": {"preset": "tiny"}, "run_id": f"prefetch-{prefetch}",
            "out_dir": str(tmp_path / str(prefetch)), "train": {"steps": steps, "log_every": 1, "prefetch": prefetch}}


def test_no_prefetch_trains_bitwise_like_the_default_and_only_issues_later(tmp_path):
    on, off = (run_ranks(_train_rank, 2, _spec(tmp_path, prefetch))[0] for prefetch in (True, False))
    assert len(on["losses"]) == 3 and on["losses"] == off["losses"]
    assert all(torch.equal(a, b) for a, b in zip(on["params"], off["params"]))
    assert on["collectives"] == off["collectives"]  # the same collectives, bytes and groups
    # the first step of the tiny preset (2 layers): forward gathers the root (final norm), the embedding, both layers
    # and lm_head; backward gathers the layers and the embedding again and reduces every unit. Default: lm_head's
    # backward prefetches the last layer's gather before its own reduce-scatter, and so on down; without prefetch
    # each gather comes after the reduce-scatter of the unit before it.
    step = 5 + 3 + 5  # gathers in forward, again in backward, reduce-scatters
    assert (on["order"][:step], off["order"][:step]) == ("GGGGG" + "GRGRGRRR", "GGGGG" + "RGRGRGRR")
    assert sorted(on["order"]) == sorted(off["order"])


def test_the_dry_run_counts_the_same_collectives_without_prefetch(tmp_path):
    raw = {"strategy": "fl_hsdp", "F": 2, "R": 2, "S": 2, "A": 4, "model": {"preset": "tiny"},
           "out_dir": str(tmp_path)}
    default = dryrun(RunSpec.from_dict(raw))
    paper = dryrun(RunSpec.from_dict({**raw, "train": {"prefetch": False}}))
    assert paper["collectives"] == default["collectives"] and paper["collectives"]["step"]
