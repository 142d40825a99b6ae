"""Seconds torch.compile spends compiling (train.compile), so that training time leaves them out: the first call
of each compiled layer, its first backward, and any recompilation, as dynamo's start and end callbacks bracket
them (nested compilations count once). It counts them too: graphs dynamo traced, and how many of those were
recompilations of a frame traced before (compile id `frame/k` with k > 0), which a step should never need."""
from __future__ import annotations

import re
import time
import weakref
from collections.abc import Callable

import torch._dynamo.callback


class CompileClock:
    """Calls the bound method `spent(seconds)` after each compilation, until closed; it holds its object weakly
    (dynamo's handler is process-wide: a trainer that never finishes train(), as in tests and the dry-run, is
    not kept alive by it)."""

    def __init__(self, spent: Callable[[float], None], starting: Callable[[], None] | None = None):
        """`spent(seconds)` after each compilation; `starting()` before it (both bound methods, held weakly)."""
        self.spent, self.started = weakref.WeakMethod(spent), 0.0
        self.starting = weakref.WeakMethod(starting) if starting is not None else None
        self.graphs = self.recompiles = 0  # dynamo's traces (backward compilations not counted)
        handler = torch._dynamo.callback.callback_handler
        self._start = handler.register_start_callback(self._on_start)
        self._end = handler.register_end_callback(self._on_end)

    def _on_start(self, args) -> None:
        self.started = time.perf_counter()
        starting = self.starting() if self.starting is not None else None
        if starting is not None:
            starting()
        if args.callback_trigger == torch._dynamo.callback.CallbackTrigger.DYNAMO:
            self.graphs += 1
            self.recompiles += _compile_index(str(args.compile_id)) > 0

    def _on_end(self, _args) -> None:
        spent = self.spent()
        if spent is not None:  # not closed from here: the handler is iterating over its callbacks
            spent(time.perf_counter() - self.started)

    def close(self) -> None:
        handler = torch._dynamo.callback.callback_handler
        handler.remove_start_callback(self._start)
        handler.remove_end_callback(self._end)


def _compile_index(compile_id: str) -> int:
    """k of dynamo's compile id `frame/k` (`[frame/k]`, `frame/k_attempt`): 0 for a frame's first trace."""
    found = re.search(r"/(\d+)", compile_id)
    return int(found.group(1)) if found else 0
