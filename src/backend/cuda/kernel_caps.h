// What this build's kernels can run on the current device, asked without
// any stream work (a CUDA graph may be recording on the caller's stream).
//
// Contract: wgmma_available() is true when the current device is sm_90 and
// the kernels library was compiled with sm_90a code (BASALT_CUDA_SM90A, set
// by CMakeLists.txt), so the wgmma kernels (wgmma.cuh: the MoE FP8 GEMMs,
// the MLA decode core) can launch; otherwise callers take their mma.sync
// kernels. Asked once per process (the first call's device).
//
// sm_count() is the current device's multiprocessor count (132, an H100's
// or H200's, when the runtime cannot say), asked on every call, so that
// threads driving different devices each get their own.
#pragma once

namespace basalt::cuda_kernels {

bool wgmma_available();
int sm_count();

}  // namespace basalt::cuda_kernels
