"""The constants the course's contract fixes (shared/CONTRACT.md), in one place: the checks, the
benchmarks and the instructor's code import them instead of repeating the numbers.
"""
import torch

#: ``LayerNorm(normalized_shape, eps=1e-5, ...)``: torch.nn.LayerNorm's default
LAYERNORM_EPS = 1e-5
#: ``RMSNorm(normalized_shape, eps=1e-6, ...)``: the LLaMA-style value, passed to torch explicitly
#: (torch.nn.RMSNorm's own default, eps=None, means the dtype's machine epsilon)
RMSNORM_EPS = 1e-6
#: ``norm="layer"`` / ``norm="rms"`` in ResidualBlock, TransformerBlock, TransformerStack
NORM_EPS = {"layer": LAYERNORM_EPS, "rms": RMSNORM_EPS}
#: inputs in these dtypes keep their dtype on output, with the statistics computed in float32
HALF_DTYPES = (torch.float16, torch.bfloat16)
STATS_DTYPE = torch.float32

#: the benchmarks' workloads (CPU sizes: one thread, temporaries in cache)
NORM_SHAPE = (4, 256, 128)  # 1024 rows of 128 features, 512 KiB in float32
RES_SHAPE, RES_D = (2, 512, 64), 64  # 512 positions: a loop over tokens shows
TB_SHAPE, TB_H, TB_FF = (1, 256, 32), 4, 64  # one sequence of 256 tokens: a loop over tokens shows
