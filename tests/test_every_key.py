"""Every key of every section, given a value of the wrong type, is one line and exit 2 before anything is
written: the dataclasses are the one schema, so a key added to conf/ later is checked too."""
import contextlib
import io

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from launcher.__main__ import main
from launcher.settings import CONF_DIR, register_schema

UNTYPED = ("action", "results_dir")  # checked apart: tests/test_bad_input.py


def _leaves(tree: dict, prefix: str = ""):
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def _keys(*groups: str) -> list[tuple[str, object]]:
    register_schema()
    with initialize_config_dir(str(CONF_DIR), version_base=None):
        cfg = OmegaConf.to_container(compose("config", overrides=list(groups)), resolve=False)
    cfg.pop("hydra", None)
    return [(k, v) for k, v in _leaves(cfg) if k not in UNTYPED]


@pytest.mark.parametrize("groups", [("sweep=smoke",), ("sweep=paper_table3", "cluster=testbed", "train=paper")])
@pytest.mark.slow
def test_a_wrongly_typed_value_of_any_key_is_one_line_and_exit_2(groups, tmp_path):
    keys = _keys(*groups)
    assert len(keys) > 60  # train, model, data, cluster, sweep, wandb, probe and the top level
    slipped = []
    for n, (key, value) in enumerate(keys):
        wrong = "[1,2]" if value is None or isinstance(value, str) else "abc"  # a list is no scalar, text no number
        results = tmp_path / str(n)
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main([*groups, "action=plan", f"results_dir={results}", f"{key}={wrong}"])
        lines = err.getvalue().strip().splitlines()
        one_line = len(lines) == 1 and lines[0].startswith("fedshard: error: ")
        named = one_line and key.split(".")[-1] in lines[0]  # the key's own refusal, not a later failure
        if code != 2 or not named or results.exists():
            slipped.append((key, wrong, code, lines[-3:]))
    assert not slipped
