"""Flower loopback deployment vs the in-process simulation of the same FedDL work.

Starts a SuperLink and 3 SuperNodes on 127.0.0.1 (subprocesses), runs FedDL on the built-in
``digits`` data split into 3 sites (plain, SecAgg+ and/or CKKS), and the same ``fed_dl`` in process. Both include the
no-rows t-SNE stage (landmark model on the server, placement on each site). Prints wall times and
securefed payload bytes per site per aggregation (both directions) as JSON.

    python benchmarks/flower_loopback.py [--rounds 2] [--landmarks 50] [--aggregation plain secagg ckks]
        [--epsilon 2 --rows-epsilon 1 --embedding spectral-rows] [--warm-worker false]

``--warm-worker false`` runs the sites without their warm worker (a fresh ClientApp process builds the site from
Flower's ``context.state`` for every message); ``benchmarks/flower_steps.py`` compares both side by side.

With ``--epsilon``: differential privacy (seeded noise, local mode, τ_X = 128 = √64·16, the public
domain bound of digits), each site with its own ledger; the in-process reference is ``fed_dl`` with
``GradientPerturbation(insecure_noise_seed_for_testing=0)`` and the Flower run the same seed (the landmarks must
be equal). ``--embedding`` picks the
embedding stage (a ``-rows`` one under DP needs ``--rows-epsilon``).
"""

import argparse
import json
import os
import tempfile
import time

import numpy as np

from securefed.data import load_dataset
from securefed.landmarks import fed_dl
from securefed.flower import LocalDeployment
from securefed.flower.launch import write_site_files


def in_process_reference(a, agg, sites, bound, tau_x):
    """``fed_dl`` with aggregation ``agg`` in this process, then the no-rows t-SNE stage (landmark model and every
    site's placement); returns the FedDL result and the seconds both took."""
    kw = dict(rounds=a.rounds, local_steps=a.local_steps, random_state=0)
    if a.epsilon > 0:
        from securefed.accounting import GradientPerturbation

        # seeded noise on both sides (testing only: the ε is void) so that the landmarks can be compared
        kw["privacy"] = GradientPerturbation(epsilon=a.epsilon, tau_x=tau_x, insecure_noise_seed_for_testing=0)
    t0 = time.perf_counter()
    if agg == "secagg":
        ref = fed_dl(
            sites,
            a.landmarks,
            value_bound=bound,
            aggregation="secagg",
            aggregation_options={"degree": 2, "threshold": 2},
            **kw,
        )
    elif agg == "ckks":
        ref = fed_dl(sites, a.landmarks, value_bound=bound, aggregation="ckks", **kw)
    else:
        ref = fed_dl(sites, a.landmarks, **kw)
    # the no-rows t-SNE stage in process: landmark model + every site's placement
    from securefed.embedding.placement import fit_landmark_tsne, landmark_perplexity

    model = fit_landmark_tsne(ref.landmarks, 30.0, 0)
    for S in sites:
        model.transform(S, perplexity=landmark_perplexity(30.0, a.landmarks))
    t_inproc = time.perf_counter() - t0
    return ref, t_inproc


def flower_config(a, agg, bound, tau_x):
    """The Flower run's config (the same job as :func:`in_process_reference`) and the SuperNodes' node config."""
    cfg = {
        "landmarks": a.landmarks,
        "rounds": a.rounds,
        "local-steps": a.local_steps,
        "aggregation": agg,
        "min-sites": 3,
        "seed": 0,
        "method": a.embedding.split("-")[0],
        # the same landmark stage as fed_dl: FedDL on every record (no audit hold-out)
        "landmark-method": "feddl",
        "audit-holdout": 0.0,
        "nystrom": a.embedding.split("-", 1)[1] if "-" in a.embedding else "",
    }
    # the job is the paper's FedDL landmarks (and, with nystrom rows, its rows): a site answers it only when its
    # operator allows the paper's mode
    nodes = {"warm-worker": a.warm_worker == "true", "allow-paper-mode": True}
    if agg == "plain":
        nodes["allow-plain"] = True  # a site sends its uploads in the clear only when its operator allows it
    if a.epsilon > 0:
        cfg.update(
            {"epsilon": a.epsilon, "clip-norm": tau_x, "rows-epsilon": a.rows_epsilon, "noise-seed-for-testing": 0}
        )
        nodes.update({"epsilon-budget": a.epsilon + a.rows_epsilon + 0.01, "allow-seeded-noise": True})
    if agg == "secagg":
        cfg.update({"value-bound": bound, "degree": 2, "threshold": 2})
    elif agg == "ckks":
        cfg.update({"value-bound": bound})
    return cfg, nodes


def run_flower(a, agg, tmp, paths, cfg, nodes):
    """Start a SuperLink and one SuperNode per site file under ``tmp`` and run ``cfg``; returns the result, the
    landmarks (None unless the run completed), the startup seconds and the run's seconds."""
    t0 = time.perf_counter()
    with LocalDeployment(os.path.join(tmp, "dep-" + agg)) as dep:
        dep.start_superlink()
        for i, p in enumerate(paths):
            dep.start_supernode(
                f"site{i}",
                p,
                node_config=dict(nodes, **{"ledger-path": os.path.join(tmp, f"ledgers{i}")})
                if a.epsilon > 0
                else nodes,
            )
        t_up = time.perf_counter() - t0
        t1 = time.perf_counter()
        run_dir = dep.run(cfg)
        res = dep.wait_result(run_dir, 1800)
        t_run = time.perf_counter() - t1
        Y = np.load(os.path.join(run_dir, "landmarks.npy")) if res["status"] == "completed" else None
    return res, Y, t_up, t_run


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--landmarks", type=int, default=50)
    ap.add_argument("--local-steps", type=int, default=5)
    ap.add_argument("--aggregation", nargs="+", default=["plain", "secagg"])
    ap.add_argument("--epsilon", type=float, default=0.0)
    ap.add_argument("--rows-epsilon", type=float, default=0.0)
    ap.add_argument("--embedding", default="tsne-local")
    ap.add_argument("--warm-worker", default="true", choices=["true", "false"])
    a = ap.parse_args()
    tau_x = 128.0
    X = load_dataset("digits").X
    sites = np.array_split(X, 3)
    bound = float(np.max(np.abs(X)))
    out = {
        "warm_worker": a.warm_worker == "true",
        "sites": [len(s) for s in sites],
        "features": X.shape[1],
        "landmarks": a.landmarks,
        "rounds": a.rounds,
        "local_steps": a.local_steps,
        "value_bound": bound,
        "runs": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        paths = write_site_files(tmp, sites)
        for agg in a.aggregation:
            ref, t_inproc = in_process_reference(a, agg, sites, bound, tau_x)
            cfg, nodes = flower_config(a, agg, bound, tau_x)
            res, Y, t_up, t_run = run_flower(a, agg, tmp, paths, cfg, nodes)
            per = [
                {
                    "step": st["label"],
                    "to_site_bytes": st["bytes_to_site"],
                    "from_site_bytes": st["bytes_from_site"],
                    "seconds": round(st["seconds"], 2),
                }
                for st in res.get("steps", [])
            ]
            out["runs"][agg] = {
                "status": res["status"],
                "reason": res.get("reason"),
                "in_process_seconds": round(t_inproc, 2),
                "flower_startup_seconds": round(t_up, 2),
                "flower_run_seconds": round(t_run, 2),
                "server_app_seconds": round(res.get("seconds", float("nan")), 2),
                "round_trips": res.get("round_trips"),
                "messages": res.get("messages"),
                "aggregations": len(per),
                "max_abs_diff_vs_in_process": None if Y is None else float(np.max(np.abs(Y - ref.landmarks))),
                "per_aggregation": per,
                "embedding": res.get("embedding"),
                "privacy_epsilon": (res.get("privacy") or {}).get("epsilon"),
                "in_process_epsilon": (ref.privacy or {}).get("epsilon"),
                "warnings": res.get("warnings"),
            }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
