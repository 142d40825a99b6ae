"""How a step's layers run (train.activation_checkpointing, train.compile, train.float8; train.parallel.checkpointing,
train.parallel.float8): what is computed does not change. Checkpointed layers recompute exactly what they did not
keep; layers compiled per block (inductor's C++ backend on CPU) train within 1e-5 of eager over 10 steps."""
import functools
import gc
import json
import weakref

import pytest
import torch

from launcher.__main__ import main as launcher_main
from tests.support import run_ranks
from train import model as models
from train.contract.spec import RunSpec
from train.loop import Trainer
from train.measure.compile_time import CompileClock
from train.parallel import float8

TOLERANCE = 1e-5  # compiled against eager, relative, every step (the issue's; fixed before the first run)


def _losses(rank, world, raw):
    trainer = Trainer(RunSpec.from_dict(raw), rank, "cpu")
    trainer.restore()
    losses = [float(trainer.step(i)) for i in range(raw["train"]["steps"])]
    return losses, trainer.apart["compile"]


def _spec(strategy="fsdp", F=1, R=1, S=2, A=None, steps=10, **train):
    return {"strategy": strategy, "F": F, "R": R, "S": S, "A": A, "out_dir": "/nonexistent",
            "model": {"preset": "tiny"}, "train": {"steps": steps, "seq_len": 64, "batch_per_rank": 2, **train}}


def _run(raw: dict, **train) -> tuple[list[list[float]], list[float]]:
    """Every rank's losses and compile seconds of `raw` with `train` keys set, run once per session."""
    return _cached(json.dumps({**raw, "train": {**raw["train"], **train}}, sort_keys=True))


@functools.cache
def _cached(key: str) -> tuple[list[list[float]], list[float]]:
    raw = json.loads(key)
    out = run_ranks(_losses, RunSpec.from_dict(raw).world_size, raw)
    return [losses for losses, _ in out], [seconds for _, seconds in out]


def _worst(a: list[list[float]], b: list[list[float]]) -> float:
    """The largest relative difference of two runs' losses, rank by rank and step by step (a pipeline stage that is
    not the last reports 0: compared absolutely)."""
    return max(abs(x - y) / (abs(y) or 1.0) for ra, rb in zip(a, b) for x, y in zip(ra, rb))


LAYOUTS = {"fsdp": _spec(), "fl_hsdp": _spec("fl_hsdp", 2, 2, 1, A=2), "tp2": _spec(S=1, tp=2),
           "pp2": _spec(S=1, pp=2)}


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["full", "selective"])
@pytest.mark.parametrize("name", ["fsdp", "tp2"])
def test_checkpointed_layers_recompute_what_they_did_not_keep(name, mode):
    worst = _worst(_run(LAYOUTS[name], activation_checkpointing=mode)[0], _run(LAYOUTS[name])[0])
    print(f"{name}, {mode}: worst relative loss difference over 10 steps {worst:.1e}")
    assert worst <= 1e-6


@pytest.mark.slow
@pytest.mark.parametrize("name,checkpointing", [(name, "none") for name in LAYOUTS] + [("fsdp", "selective")])
def test_compiled_layers_train_as_eager_ones(name, checkpointing):
    eager, eager_compile = _run(LAYOUTS[name])
    compiled, compile_s = _run(LAYOUTS[name], compile=True, activation_checkpointing=checkpointing)
    worst = _worst(compiled, eager)
    print(f"{name}, {checkpointing} checkpointing: worst relative loss difference over 10 steps {worst:.1e}; "
          f"compile {max(compile_s):.1f} s")
    assert worst <= TOLERANCE
    assert max(eager_compile) == 0 and min(compile_s) > 0  # compilation seen, and timed apart


def _graphs(rank, world, raw):
    """(graphs, recompiles) dynamo traced after three steps, and after two evaluations with a step between."""
    trainer = Trainer(RunSpec.from_dict(raw), rank, "cpu")
    trainer.restore()
    for i in range(3):
        trainer.step(i)
    trained = trainer.compile_clock.graphs, trainer.compile_clock.recompiles
    trainer.evaluate(3)
    trainer.step(3)
    trainer.evaluate(4)
    trainer.compile_clock.close()
    return trained, (trainer.compile_clock.graphs, trainer.compile_clock.recompiles)


@pytest.mark.slow
@pytest.mark.parametrize("checkpointing", ["none", "selective"])
def test_every_layer_is_one_compiled_graph_and_evaluation_compiles_once(checkpointing):
    """Four layers compiled whole (fullgraph): training traces one graph that every layer runs (no KV cache, whose
    per-layer index made a graph per layer), and evaluation, in no-grad mode, one more, once."""
    raw = _spec(S=1, steps=4, compile=True, activation_checkpointing=checkpointing)
    raw["model"] = {"preset": "tiny", "num_hidden_layers": 4}
    [(trained, evaluated)] = run_ranks(_graphs, 1, raw)
    assert trained == (1, 0)
    assert evaluated == (2, 1)  # the evaluation mode's graph, traced at the first evaluation only


def test_the_compile_clock_keeps_no_trainer_alive():
    """dynamo's callbacks are process-wide; a trainer that never finishes train() must still be freed."""
    class Owner:
        def spent(self, seconds: float) -> None:
            pass

    owner = Owner()
    clock, alive = CompileClock(owner.spent), weakref.ref(owner)
    del owner
    gc.collect()
    assert alive() is None
    clock.close()


def test_float8_swaps_the_decoder_layers_matmuls_only_and_trains_close_to_bf16():
    """torchao's Float8Linear runs emulated on CPU: the conversion is checked here, its speed only on a GPU. Where
    the float8 extra is installed (not in CI: see pyproject.toml's test extra)."""
    Float8Linear = pytest.importorskip("torchao.float8.float8_linear").Float8Linear

    config = models.llama_config({"preset": "tiny"})
    torch.manual_seed(0)
    reference = models.build(config, "cpu").to(torch.bfloat16)
    converted = models.build(config, "cpu").to(torch.bfloat16)
    converted.load_state_dict(reference.state_dict())
    float8.convert(converted)
    linears = {name: type(m) for name, m in converted.named_modules() if isinstance(m, torch.nn.Linear)}
    assert linears.pop("lm_head") is torch.nn.Linear  # the logits stay in the compute dtype
    assert linears and set(linears.values()) == {Float8Linear}  # every matmul of every decoder layer
    ids = torch.randint(0, config.vocab_size, (2, 64), generator=torch.Generator().manual_seed(0))
    loss = converted(input_ids=ids, labels=ids).loss
    loss.backward()
    expected = reference(input_ids=ids, labels=ids).loss
    assert abs(float(loss) / float(expected) - 1) < 1e-3  # fp8's 3 mantissa bits, scaled per tensor
    assert all(p.grad is not None for p in converted.model.layers.parameters())


def test_float8_is_refused_in_one_line_where_there_is_no_fp8():
    assert float8.why_not("cpu", 1) == ("train.float8=true needs a GPU with fp8 tensor cores (H100, H200, B200); "
                                        "this run's device is cpu")
    raw = _spec(S=1, steps=1, float8=True)
    with pytest.raises(Exception, match="SpecError: train.float8=true needs a GPU with fp8 tensor cores"):
        run_ranks(_losses, 1, raw)  # the trainer refuses it before it builds the model


def test_float8_on_a_cluster_without_fp8_is_refused_before_submitting(tmp_path, capsys):
    for cluster, says in (("local", "cluster local runs on cpu"), ("leonardo", "(cluster.fp8=false)")):
        status = launcher_main(["action=plan", f"cluster={cluster}", "sweep=smoke", "train.float8=true",
                                f"results_dir={tmp_path}"] + (["cluster.topology=ideal"] if cluster != "local" else []))
        err = capsys.readouterr().err
        assert status != 0 and "train.float8=true needs GPUs with fp8 tensor cores" in err and says in err, err
        assert len(err.strip().splitlines()) == 1
