"""action=export (issue 57, item 6): a run trained for real on gloo ranks, exported from its last checkpoint, loads
with LlamaForCausalLM.from_pretrained and scores the run's last evaluation on the held-out set; a federated run
whose last step is not a multiple of A is averaged over its groups exactly as its final FedAvg averaged them."""
import json
import math
from pathlib import Path

import pytest
import torch

from launcher.__main__ import main
from launcher.settings import compose
from launcher.sweep import expand
from tests.support import run_ranks
from train.contract.result import RunResult

STEPS, A = 3, 2  # the last step is no multiple of A: the checkpoint after it holds each federation group's model


def _overrides(tmp_path: Path, tokenizer: Path) -> list[str]:
    """smoke on 2 nodes of 1 rank: fsdp-F1-R1-S2 and fl_fsdp-F2-R1-S1-A2, on text read with the tiny tokenizer."""
    return ["sweep=smoke", "cluster.gpus_per_node=1", "data=text", f"data.paths=[{tmp_path / 'corpus'}]",
            f"data.tokenizer={tokenizer}", "data.eval_fraction=0.2", f"sweep.A=[{A}]", f"train.steps={STEPS}",
            "train.seq_len=16", "train.batch_per_rank=2", f"train.checkpoint_every={STEPS}",
            f"train.log_every={STEPS}", "train.eval_every=0", f"results_dir={tmp_path / 'results'}"]


def _train(rank: int, world: int, specs: list[dict]) -> dict:
    """Each spec trained as `python -m train` trains it (result.json, checkpoints), then the model it evaluated
    last, gathered whole: {run_id: state dict} on rank 0."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from train.contract.spec import RunSpec
    from train.loop import Trainer

    out = {}
    for raw in specs:
        spec = RunSpec.from_dict(raw)
        trainer = Trainer(spec, rank, "cpu", out_dir=Path(spec.out_dir))
        result = trainer.run("gloo")
        final = get_model_state_dict(trainer.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if result is not None:
            result.save(Path(spec.out_dir) / "result.json")
            out[spec.run_id] = final
    return out


def _eval_ppl(model, spec) -> float:
    """Perplexity over exactly what Trainer.evaluate measures: data-parallel rank r of W takes rows (r + jW) mod n
    for j < ceil(n / W) of the source's eval set, so rows count twice where W does not divide n."""
    from train.data.sources import for_run

    eval_set = for_run(spec, model.config.vocab_size).eval_set(spec.train.seq_len)
    n, world = eval_set.shape[0], spec.layout.dp_world
    ids = eval_set[[(r + j * world) % n for r in range(world) for j in range(math.ceil(n / world))]]
    with torch.no_grad():
        return math.exp(model(input_ids=ids, labels=ids).loss.double().item())


def _group_tensor(checkpoint: Path, group: int, name: str) -> torch.Tensor:
    from torch.distributed.checkpoint import FileSystemReader, load

    key = f"fed{group}.model.{name}"
    size = FileSystemReader(str(checkpoint)).read_metadata().state_dict_metadata[key].size
    part = {key: torch.empty(size)}
    load(part, checkpoint_id=str(checkpoint), no_dist=True)
    return part[key]


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")  # _group_tensor's one-process load
def test_an_exported_run_loads_in_transformers_and_scores_its_last_evaluation(tmp_path, tiny_tokenizer, capsys):
    from transformers import AutoTokenizer, LlamaForCausalLM

    (tmp_path / "corpus").mkdir()
    words = [f"w{(i * 37 + i // 7) % 120}" for i in range(1500)]
    (tmp_path / "corpus" / "a.txt").write_text(" ".join(words))
    overrides = _overrides(tmp_path, tiny_tokenizer)
    runs = {r.run_id: r.spec for r in expand(compose(overrides))}
    assert sorted(runs) == ["fl_fsdp-F2-R1-S1-A2", "fsdp-F1-R1-S2"]
    for spec in runs.values():
        Path(spec.out_dir).mkdir(parents=True)
        spec.save(Path(spec.out_dir) / "spec.json")
    trained = run_ranks(_train, 2, [s.to_dict() for s in runs.values()])[0]

    for run_id, spec in runs.items():
        run_dir = Path(spec.out_dir)
        capsys.readouterr()
        assert main([*overrides, "action=export", f"run={run_id}"]) == 0
        said = capsys.readouterr().out
        assert f"exported {run_id} to {run_dir / 'hf'}" in said and f"step {STEPS} of {STEPS}" in said

        model = LlamaForCausalLM.from_pretrained(run_dir / "hf")
        eval_ppl, final = RunResult.load(run_dir / "result.json").eval_ppl, trained[run_id]
        exported = model.state_dict()
        # The model the run evaluated last, bit for bit: FSDP's shards gathered; in FL, the groups' models as
        # the checkpoint holds them averaged in fp32 as the run's final FedAvg averaged them.
        assert set(final) <= set(exported)
        assert all(torch.equal(exported[k], v) for k, v in final.items()), \
            max((exported[k] - v).abs().max().item() for k, v in final.items())
        ppl = _eval_ppl(model, spec)
        with capsys.disabled():
            print(f"\n{said}{run_id}: result.json's eval_ppl {eval_ppl!r}, the export's {ppl!r} "
                  f"(relative difference {ppl / eval_ppl - 1:.1e})")
        assert ppl == pytest.approx(eval_ppl, rel=1e-5)

        checkpoint = run_dir / "checkpoints" / f"step-{STEPS:06d}"
        per_group = json.loads((checkpoint / "meta.json").read_text())["per_group"]
        if spec.federated:
            assert "model" in per_group and "the fp32 average of its 2 federation groups' models" in said
            assert not torch.equal(_group_tensor(checkpoint, 0, "lm_head.weight"),
                                   _group_tensor(checkpoint, 1, "lm_head.weight"))  # there was something to average
        else:
            assert per_group == [] and "one model, its shards gathered" in said

        # The run's tokenizer goes with it.
        assert (run_dir / "hf" / "tokenizer.json").read_bytes() == (tiny_tokenizer / "tokenizer.json").read_bytes()
        assert AutoTokenizer.from_pretrained(run_dir / "hf")("w5 w7")["input_ids"] == \
            AutoTokenizer.from_pretrained(tiny_tokenizer)("w5 w7")["input_ids"]

    # Exporting again onto the directory now full is refused in one line, before anything is read.
    assert main([*overrides, "action=export", "run=fsdp-F1-R1-S2"]) == 2
    assert "exists and is not empty" in capsys.readouterr().err
