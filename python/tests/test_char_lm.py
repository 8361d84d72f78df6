"""examples/char_lm.py in its smoke mode: trains both models a few steps, writes the plot and the
table, and samples through the caches."""

import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")  # skipped only when torch is not installed; .ci/run installs it

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "examples", "char_lm.py")


def test_char_lm_smoke(tmp_path):
    r = subprocess.run([sys.executable, EXAMPLE, "--smoke", "--out", str(tmp_path)], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (tmp_path / "char_lm.png").stat().st_size > 1000
    table = (tmp_path / "char_lm.md").read_text()
    assert "| castle |" in table and "| causal |" in table
    assert "samples from castle (through its cache):" in r.stdout and "samples from causal" in r.stdout
