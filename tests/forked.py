"""`python -m MODULE ARGS` in processes forked from the forkserver that train.runtime.local_ranks already keeps, which
has imported torch, transformers' Llama and the launcher once: a fresh interpreter spends 5-7 s importing the trainer
per rank on this 2-core machine, more than most tests' training, and ~0.5 s per launcher command.

A child is the real entrypoint run as `__main__` (runpy, as `python -m` does) with the given argv, environment
and working directory; its stdout and stderr go to files, and its exit status is what the interpreter's would
be (SystemExit's code, 1 after an uncaught exception). What a fresh interpreter alone does (its own startup and
finalization) is tested with real subprocesses elsewhere (tests/test_entrypoint.py, tests/test_cli.py).
"""
from __future__ import annotations

import io
import multiprocessing
import os
import runpy
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import train.runtime.local_ranks
from train.contract.common import free_port

# The forkserver starts once per pytest process, with the preload of whichever call starts it: every test passes
# this one (forked children here, tests.support.run_ranks for gloo ranks).
# (not launcher.__main__: runpy runs it)
PRELOAD = (*train.runtime.local_ranks.PRELOAD, "launcher.multirun", "launcher.settings", "launcher.actions.plan",
           "launcher.actions.run", "launcher.report.results", "launcher.report.write", "launcher.actions.validate")


def _child(module: str, argv: list[str], cwd: str, env: dict, out: str, err: str) -> None:
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    for fd, path in ((1, out), (2, err)):
        opened = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(opened, fd)
        os.close(opened)
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), line_buffering=True)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), line_buffering=True, errors="backslashreplace")
    if "OMP_NUM_THREADS" in env:  # torch read it when the forkserver imported it
        import torch
        torch.set_num_threads(int(env["OMP_NUM_THREADS"]))
    sys.argv = [module, *argv]
    code = 0
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:  # noqa: BLE001 -- what the interpreter does with an uncaught exception
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _start(module: str, argv: list[str], cwd, env: dict, out: Path, err: Path) -> multiprocessing.Process:
    multiprocessing.set_forkserver_preload(list(PRELOAD))
    proc = multiprocessing.get_context("forkserver").Process(
        target=_child, args=(module, [str(a) for a in argv], str(cwd), dict(env), str(out), str(err)))
    proc.start()
    return proc


def run(module: str, *argv, cwd, env: dict, timeout: float = 600) -> subprocess.CompletedProcess:
    """`python -m module argv...` to the end, as subprocess.run(..., capture_output=True, text=True) returns it
    (a negative status: the signal that ended it)."""
    with tempfile.TemporaryDirectory() as tmp:
        out, err = Path(tmp, "out"), Path(tmp, "err")
        proc = _start(module, list(argv), cwd, env, out, err)
        proc.join(timeout)
        if proc.exitcode is None:
            proc.kill()
            proc.join()
            raise subprocess.TimeoutExpired([module, *argv], timeout)
        return subprocess.CompletedProcess([module, *argv], proc.exitcode, out.read_text(), err.read_text())


class Ranks:
    """`torchrun --nproc_per_node N -m module argv...` on forked ranks: the status is 0 when every rank ends with 0;
    once one fails, the others get SIGTERM and, 3 s later, SIGKILL (torchrun waits 30 s)."""

    def __init__(self, module: str, argv: list, nproc: int, env: dict, cwd=None):
        self._tmp = tempfile.TemporaryDirectory()
        port = free_port()
        self._files = [(Path(self._tmp.name, f"{r}.out"), Path(self._tmp.name, f"{r}.err")) for r in range(nproc)]
        self._procs = [_start(module, list(argv), cwd or os.getcwd(),
                              {**env, "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": str(nproc),
                               "LOCAL_WORLD_SIZE": str(nproc), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)},
                              out, err) for r, (out, err) in enumerate(self._files)]
        self.returncode: int | None = None
        self.stdout = self.stderr = ""

    def wait(self, timeout: float = 600) -> int:
        deadline = time.monotonic() + timeout
        while any(p.exitcode is None for p in self._procs):
            if any(p.exitcode not in (None, 0) for p in self._procs):
                self._end_the_rest()
                break
            if time.monotonic() > deadline:
                self._end_the_rest(grace_s=0)
                raise subprocess.TimeoutExpired("torchrun", timeout)
            time.sleep(0.05)
        for p in self._procs:
            p.join()
        self.returncode = 0 if all(p.exitcode == 0 for p in self._procs) else 1
        self.stdout = "".join(out.read_text() for out, _ in self._files)
        self.stderr = "".join(err.read_text() for _, err in self._files)
        self._tmp.cleanup()
        return self.returncode

    def _end_the_rest(self, grace_s: float = 3.0) -> None:
        for p in self._procs:
            if p.exitcode is None:
                try:
                    os.kill(p.pid, signal.SIGTERM if grace_s else signal.SIGKILL)
                except ProcessLookupError:  # it ended between the check and the signal
                    pass
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(p.exitcode is None for p in self._procs):
            time.sleep(0.05)
        for p in self._procs:
            if p.exitcode is None:
                p.kill()


def torchrun(module: str, *argv, nproc: int, env: dict, cwd=None) -> Ranks:
    return Ranks(module, list(argv), nproc, env, cwd)
