"""What one command acts on, built once: the composed settings and the sweep's runs (expanded on first use; a
multirun gives them over all its points). Every action (launcher.actions) is a function of it."""
from __future__ import annotations

import functools
from dataclasses import dataclass

from launcher.settings import Settings
from launcher.sweep import Run, expand


@dataclass
class Experiment:
    settings: Settings
    given: list[Run] | None = None  # a multirun's runs, every point's
    command: list[str] | None = None  # the words typed, kept in the sweep directory by the actions that run

    @functools.cached_property
    def runs(self) -> list[Run]:
        return expand(self.settings) if self.given is None else self.given
