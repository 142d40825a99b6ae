#!/usr/bin/env bash
# Save this cluster's topology and node states for offline planning:
#   slurm/capture.sh DIR   then   python -m launcher ... cluster=NAME cluster.snapshot=DIR action=plan
# Writes DIR/topology.txt (`scontrol show topology`) and DIR/nodes.txt (`scontrol -d -o show node`: -d adds
# GresUsed, the GPUs in use, without which a MIXED node's free GPUs are unknown);
# each file appears whole or not at all.
set -euo pipefail
if [ $# -ne 1 ]; then
    echo "usage: $0 DIR" >&2
    exit 2
fi
command -v scontrol >/dev/null || { echo "capture.sh: scontrol not found on PATH (run on a login node)" >&2; exit 2; }
dir=$1
mkdir -p "$dir"
for pair in "topology.txt:show topology" "nodes.txt:-d -o show node"; do
    name=${pair%%:*}
    read -r -a args <<< "${pair#*:}"
    tmp=$(mktemp "$dir/.$name.XXXXXX")
    if ! env -u SLURM_TOPO_LEN scontrol "${args[@]}" > "$tmp"; then
        rm -f "$tmp"
        echo "capture.sh: scontrol ${args[*]} failed" >&2
        exit 1
    fi
    mv "$tmp" "$dir/$name"
done
echo "captured $(grep -c . "$dir/topology.txt") topology lines and $(grep -c . "$dir/nodes.txt") nodes into $dir"
