"""Exercise 04, beyond the shared in-process checks of tests/test_checks_in_process.py: the
solution against torch in float32, in train and eval mode."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from notebook_ns import solution_ns

pytestmark = pytest.mark.transformer


@pytest.fixture(scope="module")
def solution():
    return solution_ns("04_transformer_block")


@pytest.mark.parametrize("norm_first", [True, False])
def test_solution_matches_torch_in_float32_eval_and_train(solution, norm_first):
    """Beyond the float64 checks: float32, torch's fused eval path on its side and maybe on ours."""
    torch.manual_seed(0)
    mine = solution["TransformerBlock"](32, 4, 64, norm_first=norm_first)
    ref = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, activation="gelu", batch_first=True,
                                     norm_first=norm_first)
    rename = {"attn.": "self_attn.", "ffn.0.": "linear1.", "ffn.3.": "linear2."}
    state = {}
    for k, v in mine.state_dict().items():
        for a, b in rename.items():
            k = k.replace(a, b) if k.startswith(a) else k
        state[k] = v
    ref.load_state_dict(state)
    x = torch.randn(3, 7, 32)
    kpm = torch.zeros(3, 7, dtype=torch.bool)
    kpm[1, -3:] = True
    for mode in ("train", "eval"):
        mine.train(mode == "train"), ref.train(mode == "train")
        with torch.no_grad():
            a, b = mine(x, key_padding_mask=kpm), ref(x, src_key_padding_mask=kpm)
        keep = ~kpm
        assert torch.allclose(a[keep], b[keep], atol=1e-5, rtol=1e-5), mode
