"""From laptop to a real cluster (issue 39): a cluster file written by action=init_cluster from real scontrol captures
(SLURM 22.05 and 25.11), kept outside the checkout and used with --config-dir; the plan checks it against
scontrol, says what is trained and how the job finds Python, writes each sbatch script, never replaces the plan of
a sweep with runs; host memory is checked on cluster=local; status, cancel and tail of a sweep."""
import json
import os
import shutil
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from tests import forked
from tests.support import ROOT, clean_env

CAPTURES = {  # the SLURM release -> its captures of `scontrol show topology / -o show node / show partition`
    "22.05": ROOT / "tests" / "fixtures" / "slurm-22.05.8",
    "25.11": ROOT / "tests" / "fixtures" / "slurm-25.11.7" / "tree_topology_conf",
}


def launcher(*argv, cwd, env=None):
    return forked.run("launcher", *argv, cwd=cwd, env=env or clean_env(slurm_client=False))


def snapshot(release: str, where: Path) -> Path:
    """A snapshot directory as slurm/capture.sh writes it, from the release's captures."""
    where.mkdir(parents=True)
    for name, capture in (("topology.txt", "show_topology.txt"), ("nodes.txt", "show_node_oneliner.txt"),
                          ("partitions.txt", "show_partition.txt")):
        shutil.copy(CAPTURES[release] / capture, where / name)
    return where


@pytest.mark.parametrize("release, up, nodes", [("22.05", 14, 8), ("25.11", 7, 4)])
@pytest.mark.slow
def test_init_cluster_from_captures_then_plan_paper_table3_from_outside_the_checkout(tmp_path, release, up, nodes):
    snap, conf, work = snapshot(release, tmp_path / "snap"), tmp_path / "my-conf", tmp_path / "work"
    work.mkdir()
    init = launcher("action=init_cluster", "init.name=lab", f"init.out={conf}", f"cluster.snapshot={snap}", cwd=work)
    assert init.returncode == 0, init.stderr
    written = yaml.safe_load((conf / "cluster" / "lab.yaml").read_text())
    assert written["gpus_per_node"] == 4 and written["partition"] == "boost_usr_prod"  # Gres=gpu:4, Partitions=
    assert written["cpus_per_task"] == 8 and written["mem"] == "494000M"  # CPUTot=32 / 4 GPUs, RealMemory=494000
    assert written["nodes"] == nodes and f"the largest power of two of the {up} up" in init.stdout
    assert written["nodes_per_level"][0] == 1 and len(written["bandwidth_GBps"]) == len(written["nodes_per_level"])
    assert written["peak_flops"] == 312e12 and written["gpu_memory_GB"] is None  # a100 from the node features
    assert "not inferred: gpu_memory_GB: the a100 is sold with several memory sizes" in init.stdout
    assert written["name"] is None and written["snapshot"] == str(snap)
    again = launcher("action=init_cluster", "init.name=lab", f"init.out={conf}", f"cluster.snapshot={snap}", cwd=work)
    assert again.returncode == 2 and "exists: delete it or choose another init.name" in again.stderr

    plan = launcher("--config-dir", str(conf), "cluster=lab", "sweep=paper_table3", "action=plan",
                    f"results_dir={work / 'results'}", cwd=work)
    assert plan.returncode == 0, plan.stderr
    sweep = work / "results" / "lab" / "paper_table3"  # named by its file
    runs = json.loads((sweep / "plan.json").read_text())["runs"]
    scripts = sorted((sweep / "scripts").iterdir())
    assert [p.stem for p in scripts] == sorted(r["run_id"] for r in runs) and len(runs) == 4
    text = (sweep / "scripts" / f"{runs[0]['run_id']}.sbatch").read_text()
    for line in ("#SBATCH --cpus-per-task=8", "#SBATCH --mem=494000M", "#SBATCH --gpus-per-node=4",
                 "#SBATCH --partition=boost_usr_prod", f"#SBATCH --nodes={nodes}"):
        assert line in text
    assert sys.executable in text and text.strip() in plan.stdout  # the first script is printed whole
    assert "model: llama3_8b (8.03 B parameters), random initialisation (pretraining" in plan.stdout
    assert "data: synthetic Markov chain" in plan.stdout and "global batch: " in plan.stdout
    assert f"job python: {sys.executable}" in plan.stdout and f"results_dir {work / 'results'}" in plan.stdout

    for override, message in (
            ("cluster.gpus_per_node=8", "cluster.gpus_per_node=8 but the nodes of partition boost_usr_prod have 4 "
                                        "GPUs (scontrol's Gres)"),
            ("cluster.partition=gpux", "partition 'gpux' does not exist on this cluster"),
            ("cluster.cpus_per_task=16", "= 64 CPUs per node, but the nodes of partition boost_usr_prod have 32"),
            ("cluster.mem=600G", "cluster.mem=600G per node, but the nodes of partition boost_usr_prod have 494000M")):
        bad = launcher("--config-dir", str(conf), "cluster=lab", override, "action=plan",
                       f"results_dir={work / 'bad'}", cwd=work)
        lines = bad.stderr.strip().splitlines()
        assert bad.returncode == 2 and len(lines) == 1 and lines[0].startswith("fedshard: error: ")
        assert message in bad.stderr, (override, bad.stderr)
    assert not (work / "bad").exists() or not list((work / "bad").rglob("plan.json"))


def test_results_dir_on_a_node_local_filesystem_is_warned_about():
    from launcher.settings import compose
    from launcher.slurm import jobenv

    cluster = compose(["cluster=leonardo"]).cluster
    mounts = "/dev/sda1 / ext4 rw 0 0\nfs1:/home /home nfs4 rw 0 0\nlustre@o2ib:/scratch /scratch lustre rw 0 0\n"
    assert jobenv.filesystem(Path("/home/me/r"), mounts) == "nfs4"
    assert jobenv.filesystem(Path("/homework"), mounts) == "ext4"  # a prefix of a name is not a mount point
    assert "WARNING: results_dir /tmp/r is on ext4" in jobenv.lines(cluster, Path("/tmp/r"), mounts)[1]
    assert jobenv.lines(cluster, Path("/scratch/r"), mounts)[1] == "results_dir: /scratch/r (lustre)"
    assert jobenv.lines(replace(cluster, python="/opt/venv/bin/python"), Path("/scratch"), mounts)[0].startswith(
        "job python: /opt/venv/bin/python (cluster.python)")


def test_config_dir_flags_and_a_copied_name(tmp_path):
    conf = tmp_path / "c"
    (conf / "cluster").mkdir(parents=True)
    local = (ROOT / "conf" / "cluster" / "local.yaml").read_text()
    (conf / "cluster" / "mine.yaml").write_text(local.replace("name: local", "name: null"))
    (conf / "cluster" / "copied.yaml").write_text(local)
    (conf / "cluster" / "nobackend.yaml").write_text(local.replace("name: local", "name: null")
                                                      .replace("backend: gloo\n", ""))
    results = f"results_dir={tmp_path / 'r'}"
    for flags in (["--config-dir", str(conf)], ["-cd", str(conf)], [f"--config-dir={conf}"]):
        proc = launcher(*flags, "cluster=mine", "action=plan", results, cwd=tmp_path)
        assert proc.returncode == 0 and "on cluster mine" in proc.stdout, proc.stderr
    cfg = launcher("--cfg", "job", "-cd", str(conf), "cluster=mine", cwd=tmp_path)
    assert cfg.returncode == 0 and yaml.safe_load(cfg.stdout)["cluster"]["nodes"] == 4, cfg.stderr
    copied = launcher("-cd", str(conf), "cluster=copied", "action=plan", results, cwd=tmp_path)
    assert copied.returncode == 2 and "cluster file copied.yaml says name: local" in copied.stderr
    meant = launcher("-cd", str(conf), "cluster=copied", "cluster.name=local", "action=plan", results, cwd=tmp_path)
    assert meant.returncode == 0, meant.stderr
    missing = launcher("-cd", str(conf), "cluster=nobackend", "action=plan", results, cwd=tmp_path)
    assert missing.returncode == 2 and "cluster is missing key(s): backend" in missing.stderr
    nodir = launcher("-cd", str(tmp_path / "none"), "action=plan", cwd=tmp_path)
    assert nodir.returncode == 2 and "no such directory" in nodir.stderr
    version = launcher("--version", cwd=tmp_path)
    assert version.returncode == 0 and version.stdout.startswith("fedshard ") and "Hydra 1.3" in version.stdout


@pytest.mark.slow
def test_local_refuses_ranks_that_exceed_this_machines_memory(tmp_path):
    proc = launcher("sweep=paper_table3", "model=llama3_8b", "action=plan", f"results_dir={tmp_path}", cwd=tmp_path)
    assert proc.returncode == 2 and "per rank x 8 ranks = " in proc.stderr and "available (MemAvailable)" in proc.stderr
    assert not list(tmp_path.rglob("plan.json"))
    fake = launcher("sweep=paper_table3", "model=llama3_8b", "action=dryrun", "sweep.strategies=[fsdp]",
                    "train.steps=2", f"results_dir={tmp_path}", cwd=tmp_path)  # fake tensors use no host memory
    assert "MemAvailable" not in fake.stderr


def test_check_host_memory_counts_every_rank(monkeypatch):
    from launcher import planning as plan
    from launcher.settings import compose
    from launcher.sweep import expand

    settings = compose(["sweep=smoke"])
    runs = expand(settings)
    need = max(plan.memory_of(r).total * r.spec.world_size for r in runs)
    monkeypatch.setattr(plan, "available_host_bytes", lambda: need)
    plan.check_host_memory(settings, runs)
    monkeypatch.setattr(plan, "available_host_bytes", lambda: need - 1)
    with pytest.raises(plan.ConfigError, match="ranks = .* on this machine"):
        plan.check_host_memory(settings, runs)


def test_plan_keeps_a_sweeps_plan_and_repeat_one_keeps_its_id(tmp_path):
    results = f"results_dir={tmp_path}"
    first = launcher("sweep=smoke", "action=plan", results, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    sweep = tmp_path / "local" / "smoke"
    before = (sweep / "plan.json").read_text()
    ids = [r["run_id"] for r in json.loads(before)["runs"]]
    (sweep / "manifest.jsonl").write_text(json.dumps({"run_id": ids[0], "attempts": 1, "state": "COMPLETED"}) + "\n")
    again = launcher("sweep=smoke", "sweep.repeats=3", "action=plan", results, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert (sweep / "plan.json").read_text() == before  # what the report reads stays
    [other] = list((sweep / "plans").iterdir())
    repeated = [r["run_id"] for r in json.loads((other / "plan.json").read_text())["runs"]]
    assert repeated[:2] == ids and f"{ids[0]}-rep2" in repeated and f"{ids[0]}-rep1" not in repeated
    assert f"this plan went to {other}" in again.stdout


def test_multirun_plan_compares_each_point_with_fsdp_at_that_point(tmp_path):
    proc = launcher("-m", "sweep=smoke", "model=tiny,mini", "action=plan", f"results_dir={tmp_path}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    runs = json.loads((tmp_path / "local" / "smoke" / "plan.json").read_text())["runs"]
    fsdp = [r for r in runs if r["strategy"] == "fsdp"]
    assert len(fsdp) == 2 and all(r["predicted_speedup_over_fsdp"] == pytest.approx(1.0) for r in fsdp)


def _sweep_with_jobs(tmp_path) -> tuple[Path, list[str]]:
    """A planned smoke sweep on cluster=leonardo's snapshot whose manifest says one run is queued as job 4242 and the
    other completed, with task 0's logs where submitit writes them."""
    snap = snapshot("22.05", tmp_path / "snap")
    args = ["sweep=smoke", "cluster=leonardo", f"cluster.snapshot={snap}", "cluster.bandwidth_GBps=[240,25,12.5,6]",
            f"results_dir={tmp_path / 'r'}"]
    plan = launcher(*args, "action=plan", cwd=tmp_path)
    assert plan.returncode == 0, plan.stderr
    sweep = tmp_path / "r" / "leonardo" / "smoke"
    ids = [r["run_id"] for r in json.loads((sweep / "plan.json").read_text())["runs"]]
    entries = [{"run_id": ids[0], "attempts": 1, "state": "PENDING", "job_id": "4242"},
               {"run_id": ids[1], "attempts": 1, "state": "COMPLETED", "job_id": "4241"}]
    (sweep / "manifest.jsonl").write_text("".join(json.dumps(e) + "\n" for e in entries))
    (sweep / ids[1]).mkdir()
    (sweep / ids[1] / "result.json").write_text("{}")
    logs = sweep / ids[0] / "submitit" / "attempt1"
    logs.mkdir(parents=True)
    (logs / "4242_0_log.out").write_text(f"[{ids[0]}] step 2/6 loss 5.1\n")
    return sweep, args


def _tools(tmp_path, **bodies) -> dict:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, body in bodies.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}")
        (bin_dir / name).chmod(0o755)
    return clean_env(PATH=f"{bin_dir}:{os.environ['PATH']}")


def test_status_cancel_and_tail_of_a_sweep(tmp_path):
    sweep, args = _sweep_with_jobs(tmp_path)
    state = tmp_path / "state"
    state.write_text("RUNNING")
    env = _tools(tmp_path, squeue=f"for id in $(echo $3 | tr , ' '); do echo \"$id $(cat {state})\"; done\n",
                 scancel=f"echo \"$@\" >> {tmp_path}/scancel.calls\necho COMPLETED > {state}\n",
                 scontrol="echo 'scontrol: error: no controller' >&2\nexit 1\n")
    status = launcher(*args, "action=status", cwd=tmp_path, env=env)
    assert status.returncode == 0, status.stderr
    rows = {line.split()[0]: line for line in status.stdout.splitlines()[2:-1]}
    first, second = list(rows)
    assert rows[first].split()[1:3] == ["RUNNING", "4242"] and "step 2/6 loss 5.1" in rows[first]
    assert rows[second].split()[1:3] == ["COMPLETED", "4241"]
    assert status.stdout.splitlines()[-1].strip() == "1 running, 1 completed"
    cancel = launcher(*args, "action=cancel", cwd=tmp_path, env=env)
    assert cancel.returncode == 0, cancel.stderr
    assert (tmp_path / "scancel.calls").read_text().split() == ["4242"]  # only the job still queued or running
    assert json.loads((sweep / "manifest.jsonl").read_text().splitlines()[0])["state"] == "CANCELLED"
    ended = launcher(*args, "action=tail", f"run={first}", cwd=tmp_path, env=env)
    assert ended.returncode == 0 and "step 2/6 loss 5.1" in ended.stdout and "CANCELLED" in ended.stdout
    unknown = launcher(*args, "action=tail", "run=nope", cwd=tmp_path, env=env)
    assert unknown.returncode == 2 and "run=nope is not a run of sweep smoke" in unknown.stderr
