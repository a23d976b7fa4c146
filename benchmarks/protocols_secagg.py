"""SecAgg+ round time and bytes per client vs plaintext summation; mask expansion vs raw AES-CTR / ChaCha20.

    OMP_NUM_THREADS=1 python3 benchmarks/protocols_secagg.py            # full grid
    OMP_NUM_THREADS=1 python3 benchmarks/protocols_secagg.py --quick    # N ∈ {10, 50}, d = 1e5

Each configuration runs one complete SecAgg+ round in-process (all N clients and the server on this
machine, so "round time" is the total CPU work of every party, serialised; ``client_seconds_mean``
is one client's share, what a deployment with parallel clients waits for per client) with 10 % of the clients
dropping after the share-keys stage (``drop_stage="masked"``: the costliest case, the server must
recover their pairwise masks). Degree and threshold come from the default threat model
(δ = 0.1, γ = 0.1, σ = 40, η = 10). Plaintext summation is :class:`securefed.securesum.base.PlainAggregator` on the same float64 vectors.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from securefed.securesum.base import PlainAggregator
from securefed.securesum import SecAggAggregator, crypto


def mask_throughput(d: int = 1_000_000, reps: int = 20) -> dict:
    """GB/s of (a) raw AES-256-CTR keystream, (b) raw ChaCha20 keystream, (c) securefed's mask step
    (HKDF + AES-CTR keystream into a reusable buffer + modular add into the accumulator)."""
    nbytes = d * 4
    zeros = bytes(nbytes)
    out = bytearray(nbytes + 16)
    key = os.urandom(32)
    res = {}
    for name, make in (
        ("raw_aes256_ctr", lambda: Cipher(algorithms.AES(key), modes.CTR(bytes(16))).encryptor()),
        ("raw_chacha20", lambda: Cipher(algorithms.ChaCha20(key, bytes(16)), None).encryptor()),
    ):
        best = np.inf
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(reps):
                make().update_into(zeros, out)
            best = min(best, time.perf_counter() - t0)
        res[name] = reps * nbytes / best / 1e9
    acc = np.zeros(d, dtype=np.uint32)
    buf = bytearray(nbytes + 16)
    sid = os.urandom(16)
    best = np.inf
    for _ in range(3):
        t0 = time.perf_counter()
        for r in range(reps):
            crypto.add_mask_inplace(acc, key, session_id=sid, info=r.to_bytes(8, "little"), sign=1, buf=buf)
        best = min(best, time.perf_counter() - t0)
    res["securefed_mask_add"] = reps * nbytes / best / 1e9
    res["ratio_raw_aes_over_mask"] = res["raw_aes256_ctr"] / res["securefed_mask_add"]
    return res


def round_figures(n: int, d: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    ups = [rng.uniform(-1, 1, d) for _ in range(n)]
    plain_res = PlainAggregator().aggregate(ups)  # the product's plaintext path: acc += u per client
    plain, t_plain = plain_res.total, plain_res.seconds
    agg = SecAggAggregator(clip_range=1.0, dropout=0.1, drop_stage="masked", random_state=seed)
    res = agg.aggregate(ups)
    err = float(np.max(np.abs(res.total - np.sum([ups[i] for i in res.survivors], axis=0))))
    return {
        "clients": n,
        "length": d,
        "degree": res.details["degree"],
        "threshold": res.details["threshold"],
        "survivors": len(res.survivors),
        "round_seconds": round(res.seconds, 4),
        "client_seconds_mean": round(sum(v["clients"] for v in res.details["timings"].values()) / n, 5),
        "server_seconds": round(sum(v["server"] for v in res.details["timings"].values()), 4),
        "plain_sum_seconds": round(t_plain, 5),
        "bytes_up_per_client": res.bytes_up,
        "bytes_down_per_client": res.details["bytes_to_clients"] // n,
        "plain_bytes_per_client": d * 8,
        "max_abs_error": err,
        "error_bound": res.details["fixed_point"]["max_abs_error"],
        "plain_total_ok": bool(plain.shape == res.total.shape),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    print(json.dumps({"mask_expansion_GBps": mask_throughput()}))
    grid = (
        [(10, 100_000), (50, 100_000)]
        if args.quick
        else [(10, 100_000), (50, 100_000), (100, 100_000), (10, 1_000_000), (50, 1_000_000), (100, 1_000_000)]
    )
    for n, d in grid:
        print(json.dumps(round_figures(n, d)), flush=True)


if __name__ == "__main__":
    main()
