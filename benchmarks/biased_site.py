"""What one site with fabricated records does to the default map (issue 25 item 6; BENCHMARKS §14e).

Digits, 10 iid sites, the default plan (cells through SecAgg+, the audit gate, the t-SNE placement), in process.
Site 0 sends uploads computed from fabricated records of its declared size instead of its own: ``mean`` — every
record at the centre of the public range (8, the middle of digits' 0–16 range); ``uniform`` — records
drawn uniformly in the public range; ``one-class`` — copies of one real record of class 0 with small noise. Reported:
CA-10NN and trustworthiness of the **honest** sites' records only (site 0's records excluded), the audit verdict,
against the run with site 0 honest. Every site's checks pass in every case: a fabricated record is a record — the
secure sums, the proofs and the disclosure checks bound what the coordinator learns, not what a site feeds in.

    OMP_NUM_THREADS=1 python benchmarks/biased_site.py [--seeds 0 1 2] [--crafted]

With ``--crafted`` site 0 instead crafts its uploads of every sums pass of the cell tree (the adversary's code, patched
around the real ``SiteWorker``; its other uploads stay honest): ``inflated`` — its sums × 30, still inside the secure
sum's fixed-point range; ``negative`` — its second moments negated; ``corner`` — each of its records in a child moved
to the corner of the public range farthest from the parent's centre (in-range records, chosen per cell after seeing
the earlier totals). Each honest site checks the other sites' part of every total (``CellTree.others_problem``): the
first two are refused, the third is a sum of in-range records and passes — the residual.
"""

import argparse
import time

import numpy as np


def _corner_upload(tree, X, B: float):
    """Site 0's crafted sums-pass upload for ``--crafted corner``: its records keep their cells (so its counts stay
    its own) but each sits at the corner of [0, B]^m farthest from its parent cell's centre."""

    def corner(cell, n):
        x_c = tree.mu + cell.centre @ tree.V.T  # the centre back in the record space (the basis is orthonormal)
        f_star = (np.where(x_c < B / 2.0, B, 0.0) - tree.mu) @ tree.V
        return np.repeat(f_star[None, :], n, axis=0)

    return tree.sums_upload(tree.features(X), corner)


def _craft(mode: str, victim: str):
    """Patch the real SiteWorker so that site ``victim`` crafts its sums-pass uploads (returns the undo)."""
    from securefed.federation import site as site_mod

    honest, own_tree, check = (
        site_mod.SiteWorker._cells_upload,
        site_mod.SiteWorker.cell_tree,
        site_mod._check_total_against_own,
    )

    def cell_tree(self, task, members):  # the adversary skips its own check of the totals (it knows what it sent)
        if self.options.get("site-name") != victim:
            return own_tree(self, task, members)
        site_mod._check_total_against_own = lambda *args, **kwargs: None
        try:
            return own_tree(self, task, members)
        finally:
            site_mod._check_total_against_own = check

    def cells_upload(self, req, task, members):
        u = honest(self, req, task, members)
        tree = self._live["cell_tree"]
        q = tree.next_query()  # the query just answered
        if self.options.get("site-name") != victim or q.kind != "sums":
            return u
        if mode == "inflated":
            return 30.0 * u
        if mode == "negative":
            return np.concatenate([u[: len(u) // 2], -np.abs(u[len(u) // 2 :])])
        scale = np.concatenate([np.full(int(k), float(b)) for k, b in q.parts])
        return _corner_upload(tree, members, 16.0) / scale

    site_mod.SiteWorker._cells_upload = cells_upload  # type: ignore[method-assign]
    site_mod.SiteWorker.cell_tree = cell_tree  # type: ignore[method-assign]

    def undo():
        site_mod.SiteWorker._cells_upload = honest  # type: ignore[method-assign]
        site_mod.SiteWorker.cell_tree = own_tree  # type: ignore[method-assign]

    return undo


def crafted(seeds) -> None:
    from securefed import load_dataset, partition
    from securefed.federation.inprocess import run_in_process, site_names
    from securefed.metrics import embedding_metrics
    from securefed.plan import RunPlan

    ds = load_dataset("digits")
    for seed in seeds:
        idx = partition(ds.X, ds.y, 10, "iid", random_state=seed)
        honest_X = np.vstack([ds.X[i] for i in idx[1:]])
        honest_y = np.concatenate([ds.y[i] for i in idx[1:]])
        for mode in ("none", "inflated", "negative", "corner"):
            undo = _craft(mode, site_names(10)[0]) if mode != "none" else (lambda: None)
            plan = RunPlan.build(
                "api", method="tsne", landmark_method="cells", value_bound=16.0, seed=seed, allow_audit_failure=True
            )
            try:
                res = run_in_process(plan, [ds.X[i] for i in idx])
                coords = res.embedding["coordinates"]
                E = np.vstack([coords[k] for k in sorted(coords)][1:])
                m = embedding_metrics(honest_X, E, honest_y, random_state=0)
                print(
                    f"seed {seed} site 0 crafts {mode:8s}: completed; honest sites' CA-10NN {m['ca_10nn']:.4f} "
                    f"trust {m['trustworthiness']:.4f}; audit AUC {res.audit['mia']['auc']:.3f}",
                    flush=True,
                )
            except Exception as exc:  # the refusal is the outcome measured
                print(
                    f"seed {seed} site 0 crafts {mode:8s}: refused — {type(exc).__name__}: {str(exc)[:300]}", flush=True
                )
            finally:
                undo()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0])
    ap.add_argument("--crafted", action="store_true", help="site 0 crafts its sums-pass uploads (see the docstring)")
    a = ap.parse_args()
    if a.crafted:
        crafted(a.seeds)
        return
    from securefed import load_dataset, partition
    from securefed.federation.inprocess import run_in_process
    from securefed.metrics import embedding_metrics
    from securefed.plan import RunPlan

    ds = load_dataset("digits")
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    for seed in a.seeds:
        idx = partition(ds.X, ds.y, 10, "iid", random_state=seed)
        rng = np.random.default_rng(seed)
        n0 = len(idx[0])
        fakes = {
            "honest": ds.X[idx[0]],
            "mean": np.full((n0, ds.X.shape[1]), 8.0),
            "uniform": rng.uniform(0.0, 16.0, size=(n0, ds.X.shape[1])),
            "one-class": np.clip(
                ds.X[np.flatnonzero(ds.y == 0)[0]] + rng.normal(0.0, 0.5, (n0, ds.X.shape[1])), 0.0, 16.0
            ),
        }
        honest_X = np.vstack([ds.X[i] for i in idx[1:]])
        honest_y = np.concatenate([ds.y[i] for i in idx[1:]])
        for name, X0 in fakes.items():
            plan = RunPlan.build(
                "api", method="tsne", landmark_method="cells", value_bound=16.0, seed=seed, allow_audit_failure=True
            )
            res = run_in_process(plan, [X0] + [ds.X[i] for i in idx[1:]])
            coords = res.embedding["coordinates"]
            E = np.vstack([coords[k] for k in sorted(coords)][1:])
            m = embedding_metrics(honest_X, E, honest_y, random_state=0)
            print(
                f"seed {seed} site 0 {name:9s}: honest sites' CA-10NN {m['ca_10nn']:.4f} trust "
                f"{m['trustworthiness']:.4f}; audit AUC {res.audit['mia']['auc']:.3f} "
                f"({'pass' if res.audit['passed'] else 'fail'}); landmarks {len(res.landmarks)}"
            )


if __name__ == "__main__":
    main()
