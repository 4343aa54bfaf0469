#!/usr/bin/env bash
# The shared hash-table threshold (`options::collect_left_bytes`) swept at
# several thread counts: each TPC-H query runs one-shot (its own process)
# with `SET datafusion.optimizer.hash_join_single_partition_threshold = T`
# for each T, the thresholds interleaved, best of REPEATS. Prints, per
# thread count, each threshold's time per query and its geomean against the
# engine's own choice (no SET). The 2-thread figures of docs/performance.md
# came from this loop; 4, 8 and 16 threads need the lent many-core machine.
#
#   scripts/join-threshold-sweep.sh BINARY DATABASE
#
# DATABASE: a TPC-H database (`blobhouse load tpch --sf 10 --db DIR`, or
# the one scripts/scaling-sweep.sh loaded under its DATA_DIR). Environment:
#   THREADS=2,4,8,16  THRESHOLDS="8388608 16777216 33554432 67108864"
#   QUERIES="1 … 22"  REPEATS=2  MEMORY_LIMIT=8G
set -euo pipefail

bin=${1:?usage: scripts/join-threshold-sweep.sh BINARY DATABASE}
db=${2:?usage: scripts/join-threshold-sweep.sh BINARY DATABASE}
repo=$(cd "$(dirname "$0")/.." && pwd)
threads=${THREADS:-2,4,8,16}
thresholds=${THRESHOLDS:-8388608 16777216 33554432 67108864}
queries=${QUERIES:-$(seq 1 22)}
repeats=${REPEATS:-2}
limit=${MEMORY_LIMIT:-8G}
[ -d "$db" ] || { echo "no database at $db" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The statement time the engine reports ("… rows in 1.234 s").
run() {
  "$bin" sql --db "$db" --threads "$1" --memory-limit "$limit" -f "$2" 2>&1 | grep -o 'rows* in [0-9.]* s' | tail -1 | awk '{print $3}'
}

for n in ${threads//,/ }; do
  echo "threads $n"
  printf '%-4s %9s' q default
  for t in $thresholds; do printf ' %9s' "$((t >> 20))MiB"; done
  echo
  for q in $queries; do
    file=$repo/crates/bench/tpch/queries/q$(printf %02d "$q").sql
    cp "$file" "$work/default.sql"
    for t in $thresholds; do
      { echo "SET datafusion.optimizer.hash_join_single_partition_threshold = $t;"; cat "$file"; } > "$work/$t.sql"
    done
    declare -A best=()
    run "$n" "$work/default.sql" >/dev/null # warm-up: the page cache, not a measurement
    for _ in $(seq "$repeats"); do
      for v in default $thresholds; do
        s=$(run "$n" "$work/$v.sql")
        [ -n "$s" ] || { echo "Q$q failed at $n threads ($v)" >&2; exit 1; }
        if [ -z "${best[$v]:-}" ] || awk -v a="$s" -v b="${best[$v]}" 'BEGIN { exit !(a < b) }'; then best[$v]=$s; fi
      done
    done
    printf 'Q%-3s %9s' "$q" "${best[default]}"
    for t in $thresholds; do printf ' %9s' "${best[$t]}"; done
    echo
    unset best
  done | tee "$work/threads-$n.txt"
  awk -v names="$thresholds" 'BEGIN { split(names, t, " ") }
    { for (i = 3; i <= NF; i++) { s[i] += log($i / $2) }; n++ }
    END { printf "geomean against default:"; for (i = 3; i <= NF; i++) printf " %dMiB %.3f", t[i - 2] / 1048576, exp(s[i] / n); print "" }' "$work/threads-$n.txt"
done
