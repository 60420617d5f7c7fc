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

#: the benchmarks' workloads on the CPU (float32, one thread, temporaries in cache)
NORM_SHAPE = (4, 256, 128)  # 1024 rows of 128 features, 512 KiB in float32
RES_SHAPE, RES_D = (2, 512, 64), 64  # 512 positions: a loop over tokens shows
TB_SHAPE, TB_H, TB_FF = (1, 256, 32), 4, 64  # one sequence of 256 tokens: a loop over tokens shows
#: exercise 06: (batch, tokens, streams, features), n = 4 streams as in mHC, and a batch of (n, n) logits
STREAMS_SHAPE, STREAMS_D, STREAMS_N = (2, 128, 4, 64), 64, 4  # 256 tokens: a loop over tokens shows

#: ...and on a CUDA GPU (bfloat16): sizes a GPU sees in a transformer's forward pass
CUDA_NORM_SHAPE = (4, 4096, 4096)  # 16384 rows of 4096 features (a 7B model's width), 128 MiB in bfloat16
CUDA_RES_SHAPE, CUDA_RES_D = (4, 2048, 4096), 4096  # 8192 tokens of 4096, a 4096 x 4096 linear branch
CUDA_TB_SHAPE, CUDA_TB_H, CUDA_TB_FF = (8, 1024, 1024), 16, 4096  # 8 sequences of 1024 tokens, d_model 1024
CUDA_STREAMS_SHAPE, CUDA_STREAMS_D = (4, 2048, 4, 2048), 2048  # 8192 tokens of 4 streams of 2048, 128 MiB in bfloat16

#: the benchmarks' dtype per device type
BENCH_DTYPE = {"cpu": torch.float32, "cuda": torch.bfloat16}
#: every benchmark's workload per device type: ``input`` is the input's shape, the rest are the
#: module's sizes (``d``: features; ``heads``, ``d_ff``: the transformer block's; ``n``: residual streams,
#: ``logits``: the batch of (n, n) logits exercise 06 times sinkhorn_knopp on)
BENCH_SIZES = {
    "cpu": {"norm": {"input": NORM_SHAPE, "d": NORM_SHAPE[-1]},
            "backward": {"input": (1024, 256), "d": 256},  # exercise 05: forward + backward, float32
            "residual": {"input": RES_SHAPE, "d": RES_D},
            "transformer_block": {"input": TB_SHAPE, "d": TB_SHAPE[-1], "heads": TB_H, "d_ff": TB_FF},
            # exercise 06: MHCResidual forward + backward, and sinkhorn_knopp on one (n, n) matrix per token
            "streams": {"input": STREAMS_SHAPE, "d": STREAMS_D, "n": STREAMS_N,
                        "logits": STREAMS_SHAPE[:2] + (STREAMS_N, STREAMS_N)}},
    "cuda": {"norm": {"input": CUDA_NORM_SHAPE, "d": CUDA_NORM_SHAPE[-1]},
             "backward": {"input": (16384, 4096), "d": 4096},  # exercise 05, bfloat16
             "residual": {"input": CUDA_RES_SHAPE, "d": CUDA_RES_D},
             "transformer_block": {"input": CUDA_TB_SHAPE, "d": CUDA_TB_SHAPE[-1], "heads": CUDA_TB_H,
                                   "d_ff": CUDA_TB_FF},
             "streams": {"input": CUDA_STREAMS_SHAPE, "d": CUDA_STREAMS_D, "n": STREAMS_N,
                         "logits": CUDA_STREAMS_SHAPE[:2] + (STREAMS_N, STREAMS_N)}},
}
