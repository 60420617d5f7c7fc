"""A failing test cell shows the verdict, not the course's internals (IPython's ``_render_traceback_``
on :class:`coursekit.checks.CheckFailed`): what JupyterLab, Colab, VS Code and nbconvert show, since
they all format errors through IPython."""
from __future__ import annotations

import subprocess
import sys

from course.release import ROOT

CELL = r'''
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance(colors="NoColor")
shell.run_cell("import torch\nfrom torch import nn\nfrom coursekit.checks import run, smoke")
shell.run_cell("class LayerNorm(nn.Module):\n    def __init__(self, d, eps=1e-5):\n        super().__init__()\n"
               "        raise NotImplementedError\n")
shell.run_cell('run("layernorm_matches_torch", globals())')
shell.run_cell("smoke(lambda: LayerNorm(4))")
shell.run_cell("class LayerNorm(nn.Module):\n    def __init__(self, d, eps=1e-5):\n        super().__init__()\n"
               "        self.weight = nn.Parameter(torch.ones(d))\n        self.bias = nn.Parameter(torch.zeros(d))\n"
               "    def forward(self, x):\n        return x\n")
shell.run_cell('run("layernorm_matches_torch", globals())')
'''


def test_a_failing_check_shows_its_message_and_no_course_frame():
    out = subprocess.run([sys.executable, "-c", CELL], capture_output=True, text=True, cwd=ROOT, timeout=300)
    text = out.stdout + out.stderr
    assert text.count("CheckFailed: not implemented yet") == 2, text[-3000:]
    assert "does not match torch" in text, text[-3000:]
    for internal in ("coursekit/checks", "verdict(", "def judge", "Traceback (most recent call last)"):
        assert internal not in text, (internal, text[-3000:])
