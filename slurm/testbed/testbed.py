"""A real SLURM mini-cluster on one machine: `python slurm/testbed/testbed.py up|down|status`.

Each node is a network namespace (own hostname and /etc/hosts through a private UTS and
mount namespace) cabled to a leaf-switch bridge, leaves to a spine bridge, all in the
testbed's own namespaces; links are shaped with tc htb so that inside a node (loopback)
>> under a leaf >> across the spine. munged, a private MariaDB and slurmdbd (so sacct
works), slurmctld (in the hub namespace) and one slurmd per node run from Debian's packages. Everything is described by
conf/cluster/testbed.yaml's `network` (or another testbed shape's cluster file, `up --cluster NAME`), which the launcher
reads too: `up` records the shape it built (network.json in the state dir) and the launcher refuses a cluster file
whose network is not the one running.

Safety: nothing is routed outside the testbed's namespaces; `down` ends exactly the
processes `up` started (recorded PIDs) and those inside the testbed's namespaces, then
deletes the namespaces. The machine's /etc/hosts is never touched.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
CLUSTERS = ROOT / "conf" / "cluster"
STATE = Path(os.environ.get("FEDSHARD_TESTBED_STATE", "/tmp/fedshard-testbed"))
PREFIX = "fsb-"
HUB = "fsb-hub"
DB_PASSWORD = "fedshard-testbed"  # a private MariaDB reachable only on the hub namespace's loopback


def sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if check and proc.returncode:
        raise SystemExit(f"testbed: `{' '.join(cmd)}` failed: {proc.stderr.strip()}")
    return proc


def merged(base: dict, over: dict) -> dict:
    """`over` on `base`, dictionaries merged key by key as Hydra merges a config on its defaults."""
    out = dict(base)
    for key, value in over.items():
        out[key] = merged(base[key], value) if isinstance(value, dict) and isinstance(base.get(key), dict) else value
    return out


def described(cluster: str) -> dict:
    """The `network` of conf/cluster/<cluster>.yaml, on those of the testbed files it names in its defaults."""
    path = CLUSTERS / f"{cluster}.yaml"
    if not path.is_file():
        raise SystemExit(f"testbed: no cluster file {path}")
    conf = yaml.safe_load(path.read_text())
    net: dict = {}
    for base in conf.get("defaults", []):
        if isinstance(base, str) and (CLUSTERS / f"{base}.yaml").is_file():
            net = merged(net, described(base))
    if "network" not in conf and not net:
        raise SystemExit(f"testbed: {path} has no `network` to build")
    return merged(net, conf.get("network", {}))


def network(cluster: str | None = None) -> dict:
    """The shape to build (`cluster`), else the one built (network.json), else conf/cluster/testbed.yaml's."""
    built = STATE / "network.json"
    if cluster is None and built.is_file():
        return json.loads(built.read_text())
    net = described(cluster or "testbed")
    net["cluster"] = cluster or "testbed"
    nodes = [n for members in net["leaves"].values() for n in members]
    net["nodes"] = nodes
    net["addr"] = {n: f"{net['subnet']}.{11 + i}" for i, n in enumerate(nodes)}
    net["addr"]["hub"] = f"{net['subnet']}.1"
    return net


def namespaces(net: dict) -> list[str]:
    return [HUB, PREFIX + net["spine"], *(PREFIX + leaf for leaf in net["leaves"]), *(PREFIX + n for n in net["nodes"])]


# ---------------------------------------------------------------- configuration files

def write_configs(net: dict, accounting: bool) -> None:
    """A fresh cluster every time: a previous run's controller state or spool would resurrect old jobs."""
    STATE.mkdir(parents=True, exist_ok=True)
    for sub in ("ctld", "log", "spool"):
        shutil.rmtree(STATE / sub, ignore_errors=True)
        (STATE / sub).mkdir()
    key = STATE / "munge.key"
    if not key.exists():
        key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    hosts = "127.0.0.1 localhost\n" + "".join(f"{a} {n}\n" for n, a in net["addr"].items())
    (STATE / "hosts").write_text(hosts)
    topo = "".join(f"SwitchName={leaf} Nodes={','.join(m)}\n" for leaf, m in net["leaves"].items())
    topo += f"SwitchName={net['spine']} Switches={','.join(net['leaves'])}\n"
    (STATE / "topology.conf").write_text(topo)
    nodes = "".join(f"NodeName={n} NodeAddr={net['addr'][n]} NodeHostname={n} CPUs=2 Sockets=1 CoresPerSocket=2 "
                    f"ThreadsPerCore=1 RealMemory=2000 State=UNKNOWN\n" for n in net["nodes"])
    accounting_lines = (f"AccountingStorageType=accounting_storage/slurmdbd\n"
                        f"AccountingStorageHost={net['addr']['hub']}\nAccountingStoragePort=6819\n"
                        f"AccountingStoragePass={STATE}/munge.socket\n") if accounting else \
        "AccountingStorageType=accounting_storage/none\n"
    source = f"conf/cluster/{net['cluster']}.yaml"
    (STATE / "slurm.conf").write_text(f"""# generated by slurm/testbed/testbed.py from {source}
ClusterName=fedshard-testbed
SlurmctldHost=hub({net['addr']['hub']})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={STATE}/munge.socket,cred_expire=10
CryptoType=crypto/munge
StateSaveLocation={STATE}/ctld
SlurmdSpoolDir={STATE}/spool/%n
SlurmctldPidFile={STATE}/slurmctld.pid
SlurmdPidFile={STATE}/slurmd-%n.pid
SlurmctldLogFile={STATE}/log/slurmctld.log
SlurmdLogFile={STATE}/log/slurmd-%n.log
SlurmctldPort=6817
SlurmdPort=6818
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
{accounting_lines}MailProg=/bin/true
TopologyPlugin=topology/tree
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
# 1: a node set DOWN by hand stays down until resumed, as on production clusters (2 would return it as soon as
# its slurmd re-registers, and the node-loss test could not take a node away)
ReturnToService=1
MpiDefault=none
SlurmctldTimeout=30
SlurmdTimeout=30
# Shorter than SLURM's defaults so tests do not idle; the launcher copes with any values: after scancel,
# tasks (submitit ignores SIGTERM) may run on for KillWait s; a requeued job waits cred_expire s to restart,
# then for the next scheduling pass (sched_interval). cred_expire stays 10: it is also how long a step's
# credential lives, and a step launched on 2 busy cores may take seconds to start.
KillWait=2
# Preemption by partition priority, as sites run it: a preempted job is cancelled and ends PREEMPTED (the launcher
# resubmits it; PreemptMode=REQUEUE would requeue it under its own id). With one partition nothing is ever
# preempted; tests/test_testbed.py adds a higher-priority partition (scontrol create) for the test that preempts.
PreemptType=preempt/partition_prio
PreemptMode=CANCEL
{nodes}PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")
    dbd = STATE / "slurmdbd.conf"  # slurmdbd reads it beside slurm.conf and insists on mode 600
    dbd.write_text(f"""# generated by slurm/testbed/testbed.py
AuthType=auth/munge
AuthInfo=socket={STATE}/munge.socket
DbdHost=hub
DbdAddr={net['addr']['hub']}
DbdPort=6819
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=3306
StorageUser=slurm
StoragePass={DB_PASSWORD}
StorageLoc=slurm_acct_db
PidFile={STATE}/slurmdbd.pid
LogFile={STATE}/log/slurmdbd.log
""")
    dbd.chmod(0o600)


# ---------------------------------------------------------------- network

def shape(ns: str, dev: str, rate: str) -> None:
    sh("tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "10")
    sh("tc", "-n", ns, "class", "add", "dev", dev, "parent", "1:", "classid", "1:10", "htb", "rate", rate,
       "ceil", rate, "burst", "64k", "cburst", "64k")


def cable(ns_a: str, dev_a: str, ns_b: str, dev_b: str, rate: str | None, n: int) -> None:
    """A veth between two namespaces; each end shaped (both directions) when `rate` is given."""
    a, b = f"fsbv{n}a", f"fsbv{n}b"
    sh("ip", "link", "add", a, "type", "veth", "peer", "name", b)
    for tmp, ns, dev in ((a, ns_a, dev_a), (b, ns_b, dev_b)):
        sh("ip", "link", "set", tmp, "netns", ns)
        sh("ip", "-n", ns, "link", "set", tmp, "name", dev)
        if rate:
            shape(ns, dev, rate)


def build_network(net: dict) -> None:
    for ns in namespaces(net):
        sh("ip", "netns", "add", ns)
        sh("ip", "-n", ns, "link", "set", "lo", "up")
    spine = PREFIX + net["spine"]
    switches = [spine, *(PREFIX + leaf for leaf in net["leaves"])]
    for ns in switches:
        sh("ip", "-n", ns, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", ns, "link", "set", "br0", "up")
    n = 0

    def attach(ns: str, dev: str) -> None:
        sh("ip", "-n", ns, "link", "set", dev, "master", "br0")
        sh("ip", "-n", ns, "link", "set", dev, "up")

    cable(HUB, "eth0", spine, "hub", None, n)
    attach(spine, "hub")
    for leaf, members in net["leaves"].items():
        n += 1
        cable(PREFIX + leaf, "up0", spine, leaf, net["trunk"], n)
        attach(PREFIX + leaf, "up0")
        attach(spine, leaf)
        for node in members:
            n += 1
            cable(PREFIX + node, "eth0", PREFIX + leaf, node, net["node_link"], n)
            attach(PREFIX + leaf, node)
    for host in ("hub", *net["nodes"]):
        ns = HUB if host == "hub" else PREFIX + host
        sh("ip", "-n", ns, "addr", "add", f"{net['addr'][host]}/24", "dev", "eth0")
        sh("ip", "-n", ns, "link", "set", "eth0", "up")


# ---------------------------------------------------------------- daemons

def in_host(ns: str, hostname: str, cmd: list[str], log: Path) -> subprocess.Popen:
    """Run `cmd` in namespace `ns` with its own hostname and /etc/hosts (private UTS + mount namespaces)."""
    script = f"hostname {hostname} && mount --bind {STATE}/hosts /etc/hosts && exec \"$@\""
    full = ["nsenter", f"--net=/run/netns/{ns}", "unshare", "--uts", "--mount", "--propagation", "private",
            "sh", "-c", script, "sh", *cmd]
    return subprocess.Popen(full, stdout=log.open("ab"), stderr=subprocess.STDOUT, env=env(),
                            start_new_session=True)


def env() -> dict:
    return {**os.environ, "SLURM_CONF": str(STATE / "slurm.conf")}


def record(pids: dict) -> None:
    """pids.json: each process this testbed started, with its start time, so that `down` never signals a process
    that reused the number after a restart."""
    (STATE / "pids.json").write_text(json.dumps({name: [pid, _started(pid)] for name, pid in pids.items()}))


def _started(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat, field 22); None when it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def recorded() -> set[int]:
    """The processes pids.json names that still run: the same number and the same start time."""
    pids_file = STATE / "pids.json"
    ours = json.loads(pids_file.read_text()) if pids_file.exists() else {}
    return {pid for pid, start in ours.values() if start is not None and _started(pid) == start}


def inside(net: dict) -> set[int]:
    """The processes running in the testbed's namespaces."""
    found = set()
    for ns in namespaces(net):
        if Path(f"/run/netns/{ns}").exists():
            found |= {int(p) for p in sh("ip", "netns", "pids", ns, check=False).stdout.split()}
    return found


def stale() -> bool:
    """The namespaces' files are there but nothing of the testbed runs (the machine restarted under it): `down`
    only deletes them."""
    return Path(f"/run/netns/{HUB}").exists() and not recorded() and not inside(network())


def lab(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(["nsenter", f"--net=/run/netns/{HUB}", *cmd], capture_output=True, text=True, env=env(),
                          timeout=60)


def up(accounting: bool = True, cluster: str = "testbed") -> None:
    """Start the cluster shaped as conf/cluster/<cluster>.yaml; without `accounting` there is no slurmdbd and sacct
    knows no job."""
    if stale():
        print("testbed: the namespaces of a testbed whose processes are gone are left here: deleting them")
        down()
    if Path(f"/run/netns/{HUB}").exists():
        raise SystemExit("testbed: already up (run `down` first)")
    net = network(cluster)
    write_configs(net, accounting)
    (STATE / "network.json").write_text(json.dumps(net, indent=2) + "\n")
    pids: dict[str, int] = {}
    try:
        build_network(net)
        munge = subprocess.Popen(["munged", "--force", "--foreground", f"--socket={STATE}/munge.socket",
                                  f"--key-file={STATE}/munge.key", f"--pid-file={STATE}/munged.pid",
                                  f"--seed-file={STATE}/munged.seed", f"--log-file={STATE}/log/munged.log"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        pids["munged"] = munge.pid
        record(pids)
        _wait(lambda: (STATE / "munge.socket").exists(), 10, "munged did not create its socket")
        if accounting:
            start_accounting(pids)
        ctld = in_host(HUB, "hub", ["slurmctld", "-D", "-i", "-f", str(STATE / "slurm.conf")],
                       STATE / "log" / "slurmctld.out")
        pids["slurmctld"] = ctld.pid
        record(pids)
        _wait(lambda: lab("scontrol", "ping").returncode == 0, 30, "slurmctld did not answer `scontrol ping`")
        for node in net["nodes"]:
            pids[f"slurmd-{node}"] = in_host(PREFIX + node, node, ["slurmd", "-D", "-N", node, "-f",
                                                                   str(STATE / "slurm.conf")],
                                             STATE / "log" / f"slurmd-{node}.out").pid
        record(pids)
        _wait(lambda: _all_idle(net), 60, "nodes did not all become idle (see the logs in state dir)")
    except BaseException:
        down()
        raise
    print(f"testbed up ({net['cluster']}): {len(net['nodes'])} nodes idle; run clients with slurm/testbed/lab CMD "
          f"(state {STATE})")


def start_accounting(pids: dict) -> None:
    """A private MariaDB (hub namespace, 127.0.0.1 there) and slurmdbd, so that sacct answers."""
    datadir = STATE / "mysql"
    shutil.rmtree(datadir, ignore_errors=True)
    sh("mariadb-install-db", "--no-defaults", f"--datadir={datadir}", "--user=root",
       "--auth-root-authentication-method=normal", "--skip-test-db")
    sock = STATE / "mysql.sock"
    sock.unlink(missing_ok=True)  # a socket left by an earlier MariaDB would pass the wait below unanswered
    db = subprocess.Popen(["nsenter", f"--net=/run/netns/{HUB}", "mariadbd", "--no-defaults", f"--datadir={datadir}",
                           f"--socket={sock}", "--bind-address=127.0.0.1", "--port=3306", "--user=root",
                           f"--pid-file={STATE}/mysql.pid", f"--log-error={STATE}/log/mariadb.log",
                           "--skip-name-resolve"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                          start_new_session=True)
    pids["mariadbd"] = db.pid
    record(pids)
    _wait(lambda: sock.exists() and sh("mariadb", "--no-defaults", f"--socket={sock}", "-u", "root", "-e", "SELECT 1",
                                       check=False).returncode == 0, 60, "MariaDB did not answer on its socket")
    sql = (f"CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY '{DB_PASSWORD}'; "
           "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';")
    sh("mariadb", "--no-defaults", f"--socket={sock}", "-u", "root", "-e", sql)
    pids["slurmdbd"] = in_host(HUB, "hub", ["slurmdbd", "-D"], STATE / "log" / "slurmdbd.out").pid
    record(pids)
    _wait(lambda: lab("sacctmgr", "-i", "add", "cluster", "fedshard-testbed").returncode == 0, 60,
          "slurmdbd did not accept the cluster (sacctmgr add cluster)")


def _all_idle(net: dict) -> bool:
    out = lab("sinfo", "-h", "-N", "-o", "%N %T").stdout.split()
    states = dict(zip(out[::2], out[1::2]))
    return all(states.get(n) == "idle" for n in net["nodes"])


def _wait(ok, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not ok():
        if time.monotonic() > deadline:
            raise SystemExit(f"testbed: {what} within {timeout_s:.0f} s")
        time.sleep(0.5)


def down() -> None:
    """End the processes this testbed started and everything inside its namespaces; delete the namespaces."""
    net = network()
    targets = recorded() | inside(net)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in targets:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(_alive(p) for p in targets):
            time.sleep(0.2)
    for ns in namespaces(net):
        if Path(f"/run/netns/{ns}").exists():
            sh("ip", "netns", "del", ns, check=False)
    (STATE / "pids.json").unlink(missing_ok=True)
    (STATE / "network.json").unlink(missing_ok=True)
    print("testbed down")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie child of ours is gone for our purposes
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def status() -> int:
    net = network()
    present = [ns for ns in namespaces(net) if Path(f"/run/netns/{ns}").exists()]
    print(f"namespaces: {len(present)}/{len(namespaces(net))}")
    if HUB in present:
        print(lab("sinfo").stdout, end="")
    return 0 if len(present) == len(namespaces(net)) else 1


def main(argv: list[str]) -> int:
    cluster = "testbed"
    if argv[:1] == ["up"] and "--cluster" in argv[:-1]:
        at = argv.index("--cluster")
        cluster, argv = argv[at + 1], argv[:at] + argv[at + 2:]
    if argv not in (["up"], ["up", "--no-accounting"], ["down"], ["status"]):
        print("usage: testbed.py up [--no-accounting] [--cluster NAME] | down | status", file=sys.stderr)
        return 2
    if os.geteuid() != 0:
        print("testbed: needs root (network namespaces, tc, slurmd)", file=sys.stderr)
        return 2
    if argv[0] == "up":
        up(accounting="--no-accounting" not in argv, cluster=cluster)
        return 0
    return {"down": down, "status": status}[argv[0]]() or 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
