"""Hydra's multirun (`python -m launcher -m sweep=smoke train.lr=1e-3,1e-4`): each swept key becomes an axis of
the same sweep, beside strategies x A x F x nodes. One plan, one manifest, run ids that carry the values, a table
column per swept key. Overrides are parsed by Hydra's own parser, so its sweep syntax (a,b / choice() / range() /
glob() over a group's options) means what Hydra documents."""
from __future__ import annotations

import itertools
from dataclasses import dataclass

from launcher.settings import MULTIRUN_SECTIONS, group_options, sweep_list
from launcher.sweep import expand
from train.contract.common import ConfigError

FLAGS = ("-m", "--multirun")
# what may vary between the runs of one sweep: what is trained, on what data, with what model
SWEEPABLE = MULTIRUN_SECTIONS


@dataclass(frozen=True)
class Axis:
    key: str            # e.g. train.lr, or a group: model
    values: list[str]   # as Hydra renders them for an override


def split(argv: list[str]) -> tuple[list[str], list[Axis]]:
    """The overrides every run shares, and the swept ones as axes (in the order typed)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import ValueType
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    parsed = []
    for arg in argv:  # one at a time, so the error names the override Hydra could not read
        try:
            parsed += parser.parse_overrides([arg])
        except HydraException as exc:
            raise ConfigError(f"cannot read the override {arg!r}: {str(exc).strip().splitlines()[0]}") from None
    fixed, axes = [], []
    for override in parsed:
        if not override.is_sweep_override():
            fixed.append(override.input_line)
            continue
        key = override.get_key_element().lstrip("+~")
        if key.split(".")[0] not in SWEEPABLE:
            listed = sweep_list(key, [str(v) for v in override.sweep_string_iterator()]) \
                if override.value_type != ValueType.GLOB_CHOICE_SWEEP else None
            if listed:
                raise ConfigError(f"{key} cannot be swept with -m: it is one of the sweep's own axes and takes its "
                                  f"values as one list: {listed} (with or without -m)")
            raise ConfigError(f"{key} cannot be swept with -m: one sweep runs on one cluster into one directory; "
                              f"-m sweeps train.*, model or data keys (python -m launcher -m train.lr=1e-3,1e-4), "
                              f"and a sweep's strategies, A, F and nodes take lists (sweep.A=[8,16])")
        if override.value_type == ValueType.GLOB_CHOICE_SWEEP:
            options = group_options(key, argv)  # a --config-dir's options too
            values = override.value().filter(options)
        else:
            values = list(override.sweep_string_iterator())
        if not values:
            raise ConfigError(f"{override.input_line} sweeps no value")
        axes.append(Axis(key, values))
    keys = [a.key for a in axes]
    if len(set(keys)) != len(keys):
        raise ConfigError(f"{sorted({k for k in keys if keys.count(k) > 1})[0]} is swept twice")
    return fixed, axes


def points(axes: list[Axis]) -> list[dict[str, str]]:
    """Every combination of the axes' values, {key: value}, first axis slowest."""
    return [dict(zip((a.key for a in axes), combo)) for combo in itertools.product(*(a.values for a in axes))]


def expand_points(fixed: list[str], axes: list[Axis]):
    """(settings of the first point, every run of every point): repeats interleaved across the points too, so
    drift on the machine spreads over all of them."""
    from launcher.settings import compose

    first, runs = None, []
    for point in points(axes):
        settings = compose([*fixed, *(f"{key}={value}" for key, value in point.items())])
        first = first or settings
        runs += expand(settings, point)
    return first, sorted(runs, key=lambda run: run.spec.repeat)
