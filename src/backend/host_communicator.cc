#include "backend/host_communicator.h"

#include "core/error.h"

namespace basalt {

void HostCommunicator::all_reduce(Tensor& x, ReduceOp op) {
  check_all_reduce(x, who_);
  if (x.device() == Device::kCpu) return host_all_reduce(x, op);
  Tensor h = to_host(x);
  host_all_reduce(h, op);
  staging_->copy(h, x);
}

void HostCommunicator::reduce_scatter(const Tensor& x, Tensor& out, ReduceOp op) {
  check_reduce_scatter(x, out, world_size(), who_);
  if (x.device() == Device::kCpu && out.device() == Device::kCpu) return host_reduce_scatter(x, out, op);
  Tensor h = Tensor::empty(out.shape(), out.dtype());
  host_reduce_scatter(to_host(x), h, op);
  staging_->copy(h, out);
}

void HostCommunicator::all_gather(const Tensor& x, Tensor& out) {
  check_all_gather(x, out, world_size(), who_);
  if (x.device() == Device::kCpu && out.device() == Device::kCpu) return host_all_gather(x, out);
  Tensor h = Tensor::empty(out.shape(), out.dtype());
  host_all_gather(to_host(x), h);
  staging_->copy(h, out);
}

void HostCommunicator::all_to_all(const Tensor& send, std::span<const int64_t> send_rows, Tensor& recv,
                                  std::span<const int64_t> recv_rows) {
  check_all_to_all(send, send_rows, recv, recv_rows, world_size(), who_);
  if (send.device() == Device::kCpu && recv.device() == Device::kCpu)
    return host_all_to_all(send, send_rows, recv, recv_rows);
  Tensor h = Tensor::empty(recv.shape(), recv.dtype());
  host_all_to_all(to_host(send), send_rows, h, recv_rows);
  staging_->copy(h, recv);
}

void HostCommunicator::broadcast(Tensor& x, int root) {
  check_broadcast(root, world_size(), who_);
  if (x.device() == Device::kCpu) return host_broadcast(x, root);
  Tensor h = to_host(x);
  host_broadcast(h, root);
  staging_->copy(h, x);
}

Tensor HostCommunicator::to_host(const Tensor& t) {
  if (t.device() == Device::kCpu) return t;
  BASALT_CHECK(staging_ != nullptr && staging_->device() == t.device(),
               "{} communicator: {} is not in host memory, and rank {} has no backend of its device", who_,
               t.describe(), rank());
  Tensor h = Tensor::empty(t.shape(), t.dtype());
  staging_->copy(t, h);
  return h;
}

}  // namespace basalt
