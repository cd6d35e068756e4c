# The peer of basalt_bench_cuda_attention's prefill cases: PyTorch's
# scaled_dot_product_attention (causal, bf16, contiguous K and V; on Hopper
# it runs FlashAttention's kernels) at the same shapes, timed with CUDA
# events (median of 20 calls after 3 warm-up calls). TFLOP/s count the causal
# work as the bench does: 2 * (head_dim + v_head_dim) flops per visible
# (query, key) pair and head.
#
# Usage: python3 bench/peers/torch_sdpa_prefill.py   (a machine with a GPU and PyTorch)
import torch
import torch.nn.functional as F


def run(batch, heads, seq, dk, dv):
    q = torch.randn(batch, heads, seq, dk, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(batch, heads, seq, dk, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(batch, heads, seq, dv, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(20):
        start.record()
        F.scaled_dot_product_attention(q, k, v, is_causal=True)
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    ms = sorted(times)[len(times) // 2]
    pairs = batch * seq * (seq + 1) / 2
    tflops = 2 * (dk + dv) * heads * pairs / ms / 1e9
    print(f"sdpa batch {batch} heads {heads} seq {seq} dims {dk}/{dv}: {ms * 1e3:.1f} us, {tflops:.1f} TFLOP/s")


run(1, 32, 4096, 128, 128)  # Llama-3.1-8B's heads (PyTorch repeats K/V per query head here)
run(8, 32, 512, 128, 128)
run(1, 128, 4096, 192, 128)  # DeepSeek-V3's expanded MLA
