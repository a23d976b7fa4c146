"""The run folder, written in one place: what every run leaves behind, in process or over Flower.

``result.json``            status, the run's figures (γ, survivors, bytes per site per sum, round trips), the
                           privacy block, the audit decision, ``released`` and ``warnings``
``landmarks.npy``          the landmarks (n_y × m)
``embedding.npz``          one array of coordinates per site name, rows in the site's record order (t-SNE, UMAP)
``labels.npz``             one array of cluster labels per site name (spectral clustering)
``landmark_embedding.npy`` / ``landmark_labels.npy``  the server's model of the landmarks (no-rows mode)
``density.npz``            the DP density of every record on the landmark map (``density-share`` > 0): ``counts``
                           (grid × grid, noisy), the window ``lo`` / ``hi``
``audit.json``             the membership-audit gate's decision (also when it stopped the run)
``ledger.jsonl``           the coordinator's aggregate privacy ledger (DP runs; written by the ledger itself)
``progress.jsonl``         one line per coordinator event (Flower runs)

``securefed run`` adds ``config.json``, ``metrics.json``, ``history.json``, ``embedding.npy`` / ``labels.npy``
(all sites stacked), ``y_true.npy``, ``embedding.png`` and ``audit/`` (:mod:`securefed.report.build` reads them).
"""

from __future__ import annotations

import json
import os

import numpy as np

__all__ = ["write_json", "clean", "write_run_result", "result_document"]


def _default(o):
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, (set, tuple)):
        return list(o)
    return str(o)


def clean(d):
    """Replace NaN/inf by None so the JSON is strict."""
    if isinstance(d, dict):
        return {str(k): clean(v) for k, v in d.items()}
    if isinstance(d, (list, tuple)):
        return [clean(v) for v in d]
    if isinstance(d, (float, np.floating)) and not np.isfinite(d):
        return None
    return d


def write_json(path: str, obj) -> None:
    """Strict JSON, written atomically (temp file, fsync, rename)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(clean(json.loads(json.dumps(obj, default=_default))), fh, indent=1, allow_nan=False)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def result_document(res, plan) -> dict:
    """The JSON-able part of a :class:`~securefed.federation.RunResult` (arrays go to their own files)."""
    emb = dict(res.embedding or {})
    for key in ("coordinates", "labels", "rows", "landmark_embedding", "landmark_labels", "landmark_masses"):
        emb.pop(key, None)
    if "density" in emb:
        emb["density"] = dict({k: v for k, v in emb["density"].items() if k != "counts"}, file="density.npz")
    audit = None if res.audit is None else {k: v for k, v in res.audit.items() if k != "mia_result"}
    return {
        "status": "completed",
        "run_id": res.run_id,
        "options": plan.as_dict(),
        "gamma": res.gamma,
        "lr": res.lr,
        "rounds_done": res.rounds_done,
        "mmd_history": res.mmd_history,
        "sites": res.sites,
        "site_sizes": res.site_sizes,
        "holdouts": res.holdouts,
        "n_features": res.n_features,
        "survivors": [res.sites[i] for i in res.survivors],
        "released": res.released,
        "inventory": res.inventory,
        "warnings": res.warnings,
        "privacy": res.privacy,
        "audit": audit,
        "landmark_stage": res.landmark_info,
        "embedding": emb or None,
        "steps": res.steps,
        "readmitted": res.readmitted,
        "site_errors": res.site_errors,
        "seconds": res.seconds,
        "round_trips": res.round_trips,
        "round_trips_per_stage": res.round_trips_per_stage(),
        "messages": res.messages,
        "aggregation": res.aggregation,
        "identity_fingerprints": res.identity_fingerprints,
        **({"guarantee": res.guarantee} if getattr(res, "guarantee", None) else {}),
    }


def write_run_result(out_dir: str, res, plan) -> dict:
    """Write the run folder's common files for ``res``; returns the ``result.json`` document."""
    os.makedirs(out_dir, exist_ok=True)
    np.save(os.path.join(out_dir, "landmarks.npy"), res.landmarks)
    if res.masses is not None:
        np.save(os.path.join(out_dir, "landmark_masses.npy"), np.asarray(res.masses))
    emb = res.embedding or {}
    for key in ("landmark_embedding", "landmark_labels"):
        if key in emb:
            np.save(os.path.join(out_dir, key + ".npy"), np.asarray(emb[key]))
    if "coordinates" in emb:
        np.savez(os.path.join(out_dir, "embedding.npz"), **emb["coordinates"])
    if "labels" in emb:
        np.savez(os.path.join(out_dir, "labels.npz"), **emb["labels"])
    if "density" in emb:
        d = emb["density"]
        np.savez(os.path.join(out_dir, "density.npz"), counts=d["counts"], lo=d["lo"], hi=d["hi"])
    doc = result_document(res, plan)
    if doc["audit"] is not None:
        write_json(os.path.join(out_dir, "audit.json"), doc["audit"])
    write_json(os.path.join(out_dir, "result.json"), doc)
    return doc
