#!/usr/bin/env bash
# Save this cluster's topology and node states for offline planning:
#   slurm/capture.sh DIR   then   python -m launcher ... cluster=NAME cluster.snapshot=DIR action=plan
# Writes DIR/topology.txt (`scontrol show topology`), DIR/nodes.txt (`scontrol -d -o show node`: -d adds
# GresUsed, the GPUs in use, without which a MIXED node's free GPUs are unknown), partitions.txt
# (`scontrol -o show partition`) and config.txt (`scontrol show config`: the ClusterName);
# on SLURM >= 25.05 also topoconf.yaml and topology-NAME.txt per named topology;
# each file appears whole or not at all.
set -euo pipefail
if [ $# -ne 1 ]; then
    echo "usage: $0 DIR" >&2
    exit 2
fi
command -v scontrol >/dev/null || { echo "capture.sh: scontrol not found on PATH (run on a login node)" >&2; exit 2; }
dir=$1
mkdir -p "$dir"
capture() {  # capture FILE SCONTROL-ARGS...: the file appears whole or not at all
    local name=$1; shift
    local tmp
    tmp=$(mktemp "$dir/.$name.XXXXXX")
    if ! env -u SLURM_TOPO_LEN scontrol "$@" > "$tmp"; then
        rm -f "$tmp"
        echo "capture.sh: scontrol $* failed" >&2
        exit 1
    fi
    mv "$tmp" "$dir/$name"
}
capture topology.txt show topology
capture nodes.txt -d -o show node
capture partitions.txt -o show partition
capture config.txt show config
# SLURM >= 25.05: several named topologies (topology.yaml); a bare argument to `show topology` is a name.
read -r major minor < <(scontrol --version | grep -oE '[0-9]+\.[0-9]+' | head -1 | tr . ' ')
if [ "${major:-0}" -gt 25 ] || { [ "${major:-0}" -eq 25 ] && [ "$((10#${minor:-0}))" -ge 5 ]; }; then
    capture topoconf.yaml show topoconf
    for topo in $(awk '/^- topology:/ {print $3}' "$dir/topoconf.yaml"); do
        capture "topology-$topo.txt" show topology "$topo"
    done
fi
echo "captured $(grep -c . "$dir/topology.txt") topology lines and $(grep -c . "$dir/nodes.txt") nodes into $dir"
