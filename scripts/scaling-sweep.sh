#!/usr/bin/env bash
# The thread sweep of issue 43 on a machine with many cores, from a prepared
# optimised binary: TPC-H at 1, 2, 4, 8 and 16 threads (`blobhouse bench
# scaling`), for the default layout and for 1 MiB column chunks (many more row
# groups), optionally beside DuckDB at the same thread counts.
#
#   scripts/scaling-sweep.sh BINARY OUT_DIR
#
# BINARY is a blobhouse binary, xz- or gzip-compressed or not (build it here
# with `cargo build --profile optimised -p blobhouse`, `strip -s` it — 183 MB —
# and `xz -6 -T2` it: 35 MB, which leaves no room for the DuckDB wheel in a
# 64 MiB transfer; see docs/performance.md for the two-call way). Environment:
#   SF=10  THREADS=1,2,4,8,16  QUERIES=1,...,22  REPEATS=1  LAYOUTS="default 1024"
#   DATA_DIR=/tmp/bh-scaling-data  (kept: a second run skips loading)
#   WHEELS=.whl  (a DuckDB wheel there adds DuckDB as a peer; see docs/performance.md)
#   MODE=one-shot|warm
# Loading SF 10 takes about a minute and a half per layout on one core: the
# loader is single-threaded.
set -euo pipefail

bin=${1:?usage: scripts/scaling-sweep.sh BINARY OUT_DIR}
out=${2:?usage: scripts/scaling-sweep.sh BINARY OUT_DIR}
repo=$(cd "$(dirname "$0")/.." && pwd)
sf=${SF:-10}
threads=${THREADS:-1,2,4,8,16}
queries=${QUERIES:-1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22}
repeats=${REPEATS:-1}
layouts=${LAYOUTS:-default 1024}
data=${DATA_DIR:-/tmp/bh-scaling-data}
mode=${MODE:-one-shot}
mkdir -p "$out" "$data" /tmp/bh-sweep

case "$bin" in
  *.gz) gzip -dc "$bin" > /tmp/blobhouse-sweep; bin=/tmp/blobhouse-sweep ;;
  *.xz) python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open('/tmp/blobhouse-sweep', 'wb'))" "$bin"; bin=/tmp/blobhouse-sweep ;;
esac
chmod +x "$bin"

# The benchmark finds the query files and tpch-peers.py where it was built
# (CARGO_MANIFEST_DIR); point that path at this checkout when it differs.
built_at=$(strings "$bin" | grep -o '/[^ ]*/crates/bench' | head -1 || true)
if [ -n "$built_at" ] && [ ! -e "$built_at" ]; then
  mkdir -p "$(dirname "$(dirname "$built_at")")"
  ln -s "$repo" "$(dirname "$(dirname "$built_at")")"
fi

peers=()
if ls "${WHEELS:-$repo/.whl}"/duckdb-*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/bh-site "${WHEELS:-$repo/.whl}"/duckdb-*.whl
  export PYTHONPATH=/tmp/bh-site${PYTHONPATH:+:$PYTHONPATH}
  peers=(--peers duckdb)
fi
if [ -z "${BLOBHOUSE_PLOT_FONT:-}" ] && [ ! -e /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ]; then
  font=$(python3 -c 'import matplotlib, os; print(os.path.join(os.path.dirname(matplotlib.__file__), "mpl-data/fonts/ttf/DejaVuSans.ttf"))' 2>/dev/null || true)
  [ -n "$font" ] && export BLOBHOUSE_PLOT_FONT=$font
fi

echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB; $("$bin" --version)"
warm=()
[ "$mode" = warm ] && warm=(--warm)
for layout in $layouts; do
  chunk=()
  name=sf$sf
  if [ "$layout" != default ]; then chunk=(--chunk-kib "$layout"); name=sf$sf-chunk${layout}k; fi
  work=/tmp/bh-sweep/$name
  if ! "$bin" bench scaling --sf "$sf" --threads "$threads" --queries "$queries" --repeats "$repeats" \
    --data-dir "$data" --out "$work" "${chunk[@]}" "${peers[@]}" "${warm[@]}" 2> "$work.log"; then
    tail -20 "$work.log"
    exit 1
  fi
  mkdir -p "$out/$name"
  cp "$work"/report.txt "$work"/scaling.csv "$work"/scaling.png "$out/$name/"
done
