"""What the gateway's client scripts share: one check, which prints `ok: NAME` or
`FAILED: NAME: DETAIL` and exits non-zero on the first failure."""

import sys


def check(name, condition, detail=""):
    if not condition:
        print(f"FAILED: {name}: {detail}", flush=True)
        sys.exit(1)
    print(f"ok: {name}", flush=True)
