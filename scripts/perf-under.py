#!/usr/bin/env python3
"""Where the CPU under one function goes, from a `perf script` dump.

`perf report` resolves inlined frames with addr2line, which takes more than
five minutes on blobhouse's optimised binary (about 1 GB with debug info).
`perf script --no-inline` takes about a second; this reads its output and
prints, for the samples whose stack holds ROOT, the share of all samples
spent in each function below ROOT (inclusive, each function counted once
per sample).

    perf record -F 1999 --call-graph dwarf,16384 -o perf.data <command>
    perf script -i perf.data --no-inline -F comm,tid,ip,sym > perf.txt
    scripts/perf-under.py perf.txt 'BlobScanExec::try_new'        # one function
    scripts/perf-under.py perf.txt 'create_physical_plan' --min 0.5
    scripts/perf-under.py perf.txt ''                             # everything

Iterator adapters, closures and allocation helpers are left out of the
list (they say little about where the time goes) but not out of the counts.
"""

import argparse
import collections
import re
import sys

NOISE = re.compile(r"tree_node|try_process|from_iter|try_fold|Map<I|IntoIter|::fold$|FnOnce|FnMut|stacker|spec_")
HASH = re.compile(r"::h[0-9a-f]{16}$")


def samples(path):
    """Each sample's frames, innermost first."""
    frames = []
    with open(path, errors="replace") as f:
        for line in f:
            if not line.strip():
                if frames:
                    yield frames
                frames = []
            elif line[0] in " \t":
                parts = line.strip().split(" ", 1)
                frames.append(HASH.sub("", parts[1]) if len(parts) > 1 else "?")
            else:
                frames = []
    if frames:
        yield frames


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dump", help="output of perf script --no-inline -F comm,tid,ip,sym")
    p.add_argument("root", help="substring of the function to look under ('' for all samples)")
    p.add_argument("--min", type=float, default=0.2, help="smallest share to list, percent of all samples")
    args = p.parse_args()

    total = 0
    under = 0
    counts = collections.Counter()
    for frames in samples(args.dump):
        total += 1
        outermost = None
        for i in range(len(frames) - 1, -1, -1):
            if args.root in frames[i]:
                outermost = i
                break
        if outermost is None:
            continue
        under += 1
        for name in set(f.replace("{{closure}}", "")[:160] for f in frames[:outermost]):
            counts[name] += 1
    if total == 0:
        sys.exit(f"{args.dump}: no samples (was it written by perf script?)")
    print(f"{total} samples; under {args.root!r}: {100 * under / total:.1f}%")
    for name, n in counts.most_common():
        share = 100 * n / total
        if share < args.min:
            break
        if not NOISE.search(name):
            print(f"{share:6.2f}%  {name}")


if __name__ == "__main__":
    try:
        main()
    except FileNotFoundError as e:
        sys.exit(f"perf-under: {e.filename}: no such file (write it with perf script, see --help)")
    except BrokenPipeError:
        sys.stderr.close()
