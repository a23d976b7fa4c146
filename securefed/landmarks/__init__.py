"""Landmarks: the ``n_y`` synthetic points the sites learn together through a secure sum.

:mod:`.feddl` holds FedDL's maths (Qiao et al. Algorithm 1, Eqs. 10–16), one function per equation, and
:func:`fed_dl`, the landmark stage alone run in process by the one coordinator.
"""

from .feddl import (
    FedDLResult,
    LandmarkPrivacy,
    check_sites,
    client_update,
    default_lr,
    fed_dl,
    init_landmarks,
    local_step,
    mmd,
    mmd_grad,
    release_bounds,
    server_gradient_step,
    server_model_average,
)

__all__ = [
    "mmd",
    "mmd_grad",
    "default_lr",
    "local_step",
    "client_update",
    "server_model_average",
    "server_gradient_step",
    "init_landmarks",
    "release_bounds",
    "LandmarkPrivacy",
    "FedDLResult",
    "fed_dl",
    "check_sites",
]
