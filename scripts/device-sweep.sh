#!/usr/bin/env bash
# The 16-core comparison of issue 43 on the lent machine, in two calls: the optimised
# binary (stripped, xz: ~35 MB) and the DuckDB wheel (~21 MB) do not fit one 64 MiB transfer
# beside the repository. Put the binary at .device/final.xz and the wheel under .whl/, both
# ignored; the second call must come within the machine's 30 s idle window.
#   device-sweep.sh load  : unpack the binary, load SF 10 in both layouts at once, blobhouse at 4 and 8 threads,
#                   the shared-hash-table threshold at 16 threads on the join-heavy queries.
#   device-sweep.sh peers : (same warm machine) blobhouse and DuckDB at 2 and 16 threads, both layouts.
set -u
start=$(date +%s); el() { echo $(( $(date +%s) - start )); }
cd "$(dirname "$0")/.."; repo=$(pwd)
mkdir -p /work && { [ -e /work/main ] || ln -s "$repo" /work/main; }
export BLOBHOUSE_PLOT_FONT=$(python3 -c 'import matplotlib, os; print(os.path.join(os.path.dirname(matplotlib.__file__), "mpl-data/fonts/ttf/DejaVuSans.ttf"))')
D=/tmp/data; mkdir -p $D /tmp/w
sweep() { local name=$1 t=$2; shift 2
  timeout $t /tmp/bh bench scaling --sf ${SF:-10} --repeats 1 --data-dir $D --out /tmp/w/$name "$@" > /tmp/w/$name.txt 2> /tmp/w/$name.log
  echo "$name rc=$? at $(el) s"; cat /tmp/w/$name.txt; tail -2 /tmp/w/$name.log
  mkdir -p $OUT/$name; cp /tmp/w/$name/scaling.csv /tmp/w/$name/scaling.png /tmp/w/$name/report.txt $OUT/$name/ 2>/dev/null; }
case "$1" in
load)
  python3 -c "import lzma,shutil; shutil.copyfileobj(lzma.open('.device/final.xz'), open('/tmp/bh','wb'))" && chmod +x /tmp/bh
  echo "cores $(nproc); mem $(free -g | awk '/Mem:/ {print $2}') GiB; $(uname -r); unpacked at $(el) s"
  /tmp/bh load tpch --sf ${SF:-10} --db $D/tpch-sf${SF:-10} > /tmp/w/l1 2>&1 &
  /tmp/bh load tpch --sf ${SF:-10} --chunk-mib 1 --db $D/tpch-sf${SF:-10}-chunk1024k > /tmp/w/l2 2>&1 &
  wait; tail -1 /tmp/w/l1; tail -1 /tmp/w/l2; echo "loaded at $(el) s"
  sweep sf10-4-8 100 --threads 4,8
  if [ $(el) -lt 200 ]; then
    THREADS=16 QUERIES="5 8 9 18 21" THRESHOLDS="8388608 33554432 67108864" REPEATS=1 timeout $(( 270 - $(el) )) \
      scripts/join-threshold-sweep.sh /tmp/bh $D/tpch-sf${SF:-10} 2>&1 | tee $OUT/join-threshold-16.txt
  fi
  echo "end at $(el) s" ;;
peers)
  [ -x /tmp/bh ] && [ -d $D/tpch-sf${SF:-10} ] || { echo "not the warm machine: /tmp/bh or the data is gone"; exit 3; }
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/duckdb-*.whl && export PYTHONPATH=/tmp/site
  sweep peers-sf10 230 --threads 2,16 --peers duckdb
  sweep peers-sf10-chunk1024k $(( 500 - $(el) )) --threads 2,16 --chunk-kib 1024 --peers duckdb
  echo "end at $(el) s" ;;
esac
