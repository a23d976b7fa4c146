"""The mixture landmarks' nearest-centre step, taken in blocks of draws so that its memory does not grow with
draws × cells: the same assignment as the distances computed pair by pair."""

import numpy as np
import pytest
from scipy.spatial.distance import cdist

from securefed.landmarks.celltree import _nearest


@pytest.mark.parametrize("block", [1, 7, 4096])
def test_nearest_centre_in_blocks_is_the_brute_force_nearest(block):
    rng = np.random.default_rng(block)
    Z = rng.normal(size=(1000, 9))
    C = rng.normal(size=(37, 9))
    np.testing.assert_array_equal(_nearest(Z, C, block=block), cdist(Z, C, "sqeuclidean").argmin(axis=1))
