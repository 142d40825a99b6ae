"""Llama-3.1-8B shapes on the meta device, sharded per decoder layer without allocating memory."""
import importlib.util
import resource
import subprocess
import sys

import pytest
from torch.distributed.tensor import DTensor

from tests.support import ROOT, grid, run_ranks
from train import model as models
from train.parallel import mesh as meshes
from train.parallel import parallelize


def _shard_8b(rank, world):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    config = models.llama_config({"preset": "llama3_8b"})
    model = models.build(config, "meta")
    parallelize.shard(model, meshes.data_parallel_mesh(meshes.build("cpu", grid(1, 1, world)), "fsdp"), "fp32", "fp32")
    params = list(model.parameters())
    return {
        "params": models.count_params(model),
        "all_sharded_meta": all(isinstance(p, DTensor) and p.to_local().is_meta for p in params),
        "local_numel": sum(p.to_local().numel() for p in params),
        "layers_sharded": all(type(layer).__name__.startswith("FSDP") for layer in model.model.layers),
        "rss_growth_mb": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024,
    }


def test_llama3_8b_builds_on_meta_and_shards_without_memory():
    for out in run_ranks(_shard_8b, 2):
        assert out["params"] == 8_030_261_248
        assert out["all_sharded_meta"] and out["layers_sharded"]
        assert abs(out["local_numel"] - 8_030_261_248 / 2) < 1e6
        assert out["rss_growth_mb"] < 500, f"sharding on meta grew RSS by {out['rss_growth_mb']:.0f} MB"


def test_presets_and_bad_model_keys():
    import pytest

    from train.contract.common import SpecError

    assert models.count_params(models.build(models.llama_config({"preset": "tiny"}))) == 139_584
    with pytest.raises(SpecError, match="unknown model preset 'huge'"):
        models.llama_config({"preset": "huge"})
    with pytest.raises(SpecError, match="unknown model key.*hiden_size"):
        models.llama_config({"preset": "tiny", "hiden_size": 3})


@pytest.mark.skipif(importlib.util.find_spec("scipy") is None, reason="SciPy is not installed: nothing to leave out")
def test_a_rank_imports_transformers_without_scipy():
    """train/model.py tells transformers SciPy is absent (its object-detection loss would import scipy.optimize, ~0.3 s
    of every rank's start); a rank's modules, the pipeline's loss among them, then never import it."""
    code = "import sys, train.loop, train.parallel.pipeline; print(sorted(m for m in sys.modules if 'scipy' in m))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]", proc.stdout
