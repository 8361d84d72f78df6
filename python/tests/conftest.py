import numpy as np
import pytest


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def six(rng, shape):
    """Six float32 inputs uniform in [-1, 1] (the range conformance/tolerance.h's bounds are for)."""
    return [rng.uniform(-1, 1, shape).astype(np.float32) for _ in range(6)]
