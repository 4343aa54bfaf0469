"""The conformance scripts' runner: each case a function; the names given
on the command line (else all) run in order, each reporting "ok CASE" or
"FAILED CASE" with its traceback; the exit code is 1 if any failed."""

import sys
import traceback


def run_cases(cases, names, call=lambda case: case()):
    """Runs `cases` (functions) named in `names` (all if none is) with
    `call`, reports each, and exits."""
    by_name = {f.__name__: f for f in cases}
    failed = 0
    for name in [n for n in names if n in by_name] or list(by_name):
        try:
            call(by_name[name])
            print(f"ok {name}", flush=True)
        except Exception:
            failed += 1
            print(f"FAILED {name}", flush=True)
            traceback.print_exc()
    sys.exit(1 if failed else 0)
