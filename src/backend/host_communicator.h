// HostCommunicator: the part the communicators of host memory share (the
// in-process group and the group over nodes, backend/communicator.h): each
// collective checks its arguments (throwing on this rank before it enters),
// and a tensor on a device is staged through host memory by the rank's
// staging backend (copied out, the host collective run, copied back), so
// the subclass implements each collective on host tensors only.
#pragma once

#include <span>

#include "backend/backend.h"
#include "backend/communicator.h"

namespace basalt {

class HostCommunicator : public Communicator {
 public:
  // who: the communicator's name in errors ("local", "node"); staging may
  // be null (host tensors only).
  HostCommunicator(const char* who, Backend* staging) : who_(who), staging_(staging) {}

  void all_reduce(Tensor& x, ReduceOp op) final;
  void all_gather(const Tensor& x, Tensor& out) final;
  void reduce_scatter(const Tensor& x, Tensor& out, ReduceOp op) final;
  void all_to_all(const Tensor& send, std::span<const int64_t> send_rows, Tensor& recv,
                  std::span<const int64_t> recv_rows) final;
  void broadcast(Tensor& x, int root) final;

 protected:
  // The collectives on host tensors whose arguments have been checked.
  virtual void host_all_reduce(Tensor& x, ReduceOp op) = 0;
  virtual void host_all_gather(const Tensor& x, Tensor& out) = 0;
  virtual void host_reduce_scatter(const Tensor& x, Tensor& out, ReduceOp op) = 0;
  virtual void host_all_to_all(const Tensor& send, std::span<const int64_t> send_rows, Tensor& recv,
                               std::span<const int64_t> recv_rows) = 0;
  virtual void host_broadcast(Tensor& x, int root) = 0;

 private:
  // A copy of device tensor t in host memory, through the staging backend
  // (whose copy waits for the device); a host tensor as it is.
  Tensor to_host(const Tensor& t);

  const char* who_;
  Backend* staging_;
};

}  // namespace basalt
