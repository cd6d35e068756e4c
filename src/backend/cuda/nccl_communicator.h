// NcclCommunicator: the Communicator (backend/communicator.h) over NCCL, for
// ranks that are GPUs of one host driven by threads of one process.
//
// Contract: make_nccl_group(backends) makes one communicator per backend
// (rank i is backends[i]'s GPU) with ncclCommInitAll. Each collective is
// enqueued on its rank's backend stream, after that backend's earlier work
// and before its later work, and returns without waiting for the device; the
// threads of the ranks must call the collectives in the same order, as NCCL
// requires (one thread per GPU). bf16 and f32 all-reduce; all_to_all with
// per-rank row counts is grouped sends and receives. NVLink multicast (NVLS)
// is turned off before the group is made (NCCL_NVLS_ENABLE=0) unless the
// environment already says otherwise: it can take a shared host's GPUs out
// of service. A world of one runs on a single GPU.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "backend/communicator.h"

namespace basalt {

class CudaBackend;

std::vector<std::unique_ptr<Communicator>> make_nccl_group(std::span<CudaBackend* const> backends);

}  // namespace basalt
