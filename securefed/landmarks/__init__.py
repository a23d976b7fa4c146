"""Landmarks: the ``n_y`` synthetic points the sites learn together through a secure sum.

:mod:`.feddl` holds FedDL's maths (``papers/000`` Algorithm 1, Eqs. 10–16), one function per equation.
"""

from .feddl import (FedDLResult, LandmarkPrivacy, check_sites, client_update, default_lr, fed_dl, init_landmarks,
                    local_step, lloyd_refine, mmd, mmd_grad, release_bounds, resolve_weights, server_gradient_step,
                    server_model_average, with_range)

__all__ = ["mmd", "mmd_grad", "default_lr", "local_step", "client_update", "server_model_average",
           "server_gradient_step", "init_landmarks", "resolve_weights", "release_bounds", "with_range",
           "LandmarkPrivacy", "FedDLResult", "fed_dl", "lloyd_refine", "check_sites"]
