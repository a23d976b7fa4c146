"""What importing securefed's ClientApp costs a fresh ``flwr-clientapp`` process, in two source trees side by side.

With Flower's default launcher every message starts a new interpreter, which imports flwr and then the App's
module, ``securefed.flower.client_app``. This measures the CPU seconds of that second import alone (flwr is
imported first, as Flower's ClientApp runtime does), in fresh interpreters alternating between the trees, and the
securefed modules each import pulls in.

    python benchmarks/flower_import.py --code before=/tmp/sf-base --code after=. [--repeats 15]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

CODE = (
    "import json, sys, time\n"
    "import flwr.app, flwr.clientapp, flwr.supernode.runtime.run_clientapp\n"
    "mods = set(sys.modules)\n"
    "c0, t0 = time.process_time(), time.perf_counter()\n"
    "import securefed.flower.client_app\n"
    "c1, t1 = time.process_time(), time.perf_counter()\n"
    "new = sorted(m for m in set(sys.modules) - mods if m.startswith('securefed'))\n"
    "print(json.dumps({'cpu': c1 - c0, 'wall': t1 - t0, 'modules': new}))\n"
)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--code", action="append", required=True, metavar="LABEL=ROOT")
    ap.add_argument("--repeats", type=int, default=15)
    a = ap.parse_args()
    trees = [c.split("=", 1) for c in a.code]
    res: dict = {label: [] for label, _ in trees}
    mods = {}
    for _ in range(a.repeats):
        for label, root in trees:
            env = dict(os.environ, PYTHONPATH=os.path.abspath(root))
            out = subprocess.run(
                [sys.executable, "-c", CODE],
                env=env,
                capture_output=True,
                text=True,
                check=True,
                cwd=os.path.abspath(root),
            )  # not this directory: "-c" puts the cwd first on sys.path
            row = json.loads(out.stdout)
            res[label].append(row["cpu"])
            mods[label] = row["modules"]
    for label, xs in res.items():
        print(
            json.dumps(
                {
                    "code": label,
                    "runs": len(xs),
                    "cpu_ms_median": round(1e3 * statistics.median(xs), 1),
                    "cpu_ms_min": round(1e3 * min(xs), 1),
                    "securefed_modules": len(mods[label]),
                    "modules": mods[label],
                }
            )
        )


if __name__ == "__main__":
    main()
