#!/usr/bin/env python3
"""The peer of basalt_bench_cuda_linear: torch.nn.functional.linear (cuBLAS
through PyTorch) in bf16 at the same shapes, with the same method (weights
rotated over > 256 MB of copies, median of CUDA-event-timed calls), so the
two print comparable tables in one device run.

Usage: python3 bench/peers/torch_linear.py [repeats]
"""
import sys

import torch

SHAPES = [("qkv_proj", 6144, 4096), ("o_proj", 4096, 4096), ("gate_up_proj", 28672, 4096),
          ("down_proj", 4096, 14336), ("lm_head", 128256, 4096)]
TOKENS = [1, 8, 64, 256, 4096]


def main():
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 50
    print(f"{'layer':<13} {'M':>6} {'N':>6} {'K':>6} {'us/call':>10} {'TFLOP/s':>9} {'GB/s':>9}")
    for name, n, k in SHAPES:
        weight_bytes = n * k * 2
        copies = max(2, (256 << 20) // weight_bytes + 1)
        weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
        for m in TOKENS:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            for w in range(3):
                torch.nn.functional.linear(x, weights[w % copies])
            times = []
            for r in range(repeats):
                start = torch.cuda.Event(enable_timing=True)
                stop = torch.cuda.Event(enable_timing=True)
                start.record()
                torch.nn.functional.linear(x, weights[r % copies])
                stop.record()
                stop.synchronize()
                times.append(start.elapsed_time(stop))
            sec = sorted(times)[len(times) // 2] * 1e-3
            flops = 2.0 * m * n * k
            nbytes = weight_bytes + 2 * m * k + 2 * m * n
            print(f"{name:<13} {m:>6} {n:>6} {k:>6} {sec * 1e6:>10.1f} {flops / sec * 1e-12:>9.1f} {nbytes / sec * 1e-9:>9.0f}")
        del weights


if __name__ == "__main__":
    main()
