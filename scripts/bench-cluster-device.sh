#!/usr/bin/env bash
# Issue 44's cluster figures on a lent machine with >= 16 cores, in one call of at most
# ~9 minutes. Put the optimised binary, stripped and xz-compressed, at .device/cluster.xz
# (ignored by git; carry it):
#   strip -o /tmp/bh $CARGO_TARGET_DIR/optimised/blobhouse && xz -T2 -6 -c /tmp/bh > .device/cluster.xz
# and run `scripts/bench-cluster-device.sh` there. It writes under $OUT:
#   machine.txt           lscpu, NUMA nodes and distances, memory
#   cluster-sf1/          bench cluster at SF 1 (lineitem in ~90 row groups): alone, 1, 2, 3 workers,
#                         each worker pinned to its own CPUs (acceptance: answers and GETs)
#   deploy-sf10/          bench cluster at SF 10 (1 MiB chunks): WIM (1 worker x all CPUs) vs 4 x 4
#                         vs WIC (one worker per CPU), on the queries of the NUMA paper's mix
# What a single-socket machine cannot show (WIN+MEM against WIM+FT, the share of remote
# memory accesses): docs/cluster.md, "On a multi-socket host", gives the commands.
set -u
start=$(date +%s); el() { echo $(( $(date +%s) - start )); }
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" /tmp/w
D=/tmp/data; mkdir -p $D
export BLOBHOUSE_PLOT_FONT=${BLOBHOUSE_PLOT_FONT:-$(python3 -c 'import matplotlib, os; print(os.path.join(os.path.dirname(matplotlib.__file__), "mpl-data/fonts/ttf/DejaVuSans.ttf"))' 2>/dev/null)}
python3 -c "import lzma,shutil; shutil.copyfileobj(lzma.open('.device/cluster.xz'), open('/tmp/bh','wb'))" && chmod +x /tmp/bh || { echo "no .device/cluster.xz"; exit 2; }
cpus=$(nproc)
{ lscpu; echo; ls -d /sys/devices/system/node/node* 2>/dev/null; cat /sys/devices/system/node/node*/distance 2>/dev/null; free -g; } > "$OUT/machine.txt" 2>&1
echo "cores $cpus, nodes $(ls -d /sys/devices/system/node/node* 2>/dev/null | wc -l), unpacked at $(el) s"

run() { local name=$1 t=$2; shift 2
  timeout "$t" /tmp/bh bench cluster --data-dir $D --out /tmp/w/$name "$@" > /tmp/w/$name.txt 2> /tmp/w/$name.log
  echo "$name rc=$? at $(el) s"; cat /tmp/w/$name.txt; tail -3 /tmp/w/$name.log
  mkdir -p "$OUT/$name"; cp /tmp/w/$name/* "$OUT/$name/" 2>/dev/null; cp /tmp/w/$name.log "$OUT/$name/progress.log"; }

# Acceptance: 1, 2, 3 pinned workers against the engine alone, all 22 queries, SF 1.
run cluster-sf1 200 --sf 1 --workers 1,2,3
# Deployment modes: 1 x all CPUs (WIM), 4 x (CPUs/4), one per CPU (WIC).
run deploy-sf10 $(( 520 - $(el) )) --sf 10 --chunk-kib 1024 --workers 1,4,$cpus --queries 1,3,5,6,9,18,21
echo "end at $(el) s"
