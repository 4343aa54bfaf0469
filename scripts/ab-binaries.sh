#!/bin/bash
# Compares two blobhouse builds query by query on a local TPC-H database:
# each query runs A B A B, each run in its own process; the best of the two
# runs per build counts. Interleaving keeps this VM's slow and fast phases
# out of the ratio.
#
#   scripts/ab-binaries.sh "1 2 3" OLD_BINARY NEW_BINARY [SF] [MEMORY_LIMIT]
#
# Needs bench-results/tpch-data/tpch-sf<SF> (made by `blobhouse bench tpch
# --profile local --sf <SF>`). Prints: query, new s, old s, new/old, and the
# geomean of new/old.
set -euo pipefail
queries=$1; old=$2; new=$3; sf=${4:-10}; limit=${5:-4G}
db=bench-results/tpch-data/tpch-sf$sf
[ -d "$db" ] || { echo "no database at $db: run blobhouse bench tpch --profile local --sf $sf first" >&2; exit 1; }
t=$(mktemp)
for q in $queries; do
  f=crates/bench/tpch/queries/q$(printf %02d "$q").sql
  for bin in "$old" "$new" "$old" "$new"; do
    /usr/bin/time -o "$t" -f "%e" "$bin" sql --db "$db" --memory-limit "$limit" -f "$f" >/dev/null 2>&1 || { echo "Q$q failed with $bin" >&2; exit 1; }
    echo "$q $([ "$bin" = "$old" ] && echo old || echo new) $(cat "$t")"
  done
done | awk '{k=$1" "$2; if(!(k in m)||$3<m[k])m[k]=$3} END{for(k in m)print k,m[k]}' | sort -n -k1,1 -k2,2 | paste - - |
  awk '{printf "Q%-3s new %6.2f old %6.2f  new/old %.2f\n",$1,$3,$6,$3/$6; s+=log($3/$6); n++} END{printf "geomean new/old %.3f over %d queries\n", exp(s/n), n}'
rm -f "$t"
