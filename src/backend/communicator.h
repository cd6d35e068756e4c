// Communicator: the collective operations the ranks of one model group
// (tensor parallel, expert parallel) use to exchange activations, as NCCL
// names them.
//
// Contract:
//  * A group has world_size() ranks, 0..world_size()-1. Every rank calls the
//    same collectives in the same order with tensors of the same shapes and
//    dtypes (all_to_all: counts that agree between sender and receiver); a
//    collective completes on a rank only when every rank has entered it.
//    Tensors live where the rank's backend keeps them (host memory for the
//    in-process communicator, the rank's GPU for NCCL).
//  * all_reduce(x): x becomes, on every rank, the element-wise sum (or max)
//    of every rank's x. f32 and bf16; the sum of bf16 is accumulated in f32
//    and rounded once on the in-process communicator (NCCL sums bf16 in its
//    own order).
//  * all_gather(x, out): out [world * n, ...] is every rank's x [n, ...] in
//    rank order.
//  * reduce_scatter(x, out): x [world * n, ...], out [n, ...]; rank r's out
//    becomes the element-wise sum (or max) over every rank of x's rows
//    [r * n, (r + 1) * n): all_reduce's result, of which each rank keeps
//    its own block, at half of all_reduce's traffic. f32 and bf16, summed
//    as all_reduce sums (on the in-process communicator the block's bits
//    are exactly all_reduce's).
//  * all_to_all(send, send_rows, recv, recv_rows): send's rows go out in
//    consecutive blocks, send_rows[r] of them to rank r; recv gets
//    recv_rows[r] rows from rank r, in rank order (MoE dispatch and
//    combine). send_rows[r] on this rank equals recv_rows[this rank] on
//    rank r.
//  * broadcast(x, root): every rank's x becomes root's.
//  * Shape and dtype errors throw basalt::Error on the calling rank before it
//    enters the collective.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/tensor.h"

namespace basalt {

enum class ReduceOp : uint8_t { kSum, kMax };

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual void all_reduce(Tensor& x, ReduceOp op = ReduceOp::kSum) = 0;
  virtual void all_gather(const Tensor& x, Tensor& out) = 0;
  virtual void reduce_scatter(const Tensor& x, Tensor& out, ReduceOp op = ReduceOp::kSum) = 0;
  virtual void all_to_all(const Tensor& send, std::span<const int64_t> send_rows, Tensor& recv,
                          std::span<const int64_t> recv_rows) = 0;
  virtual void broadcast(Tensor& x, int root) = 0;
  // Whether its collectives may be recorded into a graph on its rank's
  // backend (Backend::record): enqueued on that backend's stream with no
  // wait on the host, so a replay repeats them on the same buffers (NCCL's;
  // all_to_all's row counts, host values, are fixed at recording). The
  // in-process group stages through host memory and cannot.
  virtual bool can_record() const { return false; }
};

// The checks every communicator makes before entering a collective.
void check_all_reduce(const Tensor& x, const char* who);
void check_all_gather(const Tensor& x, const Tensor& out, int world, const char* who);
void check_reduce_scatter(const Tensor& x, const Tensor& out, int world, const char* who);
void check_all_to_all(const Tensor& send, std::span<const int64_t> send_rows, const Tensor& recv,
                      std::span<const int64_t> recv_rows, int world, const char* who);
void check_broadcast(int root, int world, const char* who);

// An in-process group of `world` ranks over host tensors, for ranks that run
// as threads of one process (the CPU backend, and tests of multi-rank code
// on one machine). Communicator i is rank i; each must be used by its own
// thread, since a collective waits for every rank. With `staging` (a
// backend per rank), rank i also takes tensors on staging[i]'s device,
// copied through host memory by that backend (slow; it lets several ranks
// share one GPU, which NCCL refuses, so multi-rank device code is tested on
// one GPU).
class Backend;
std::vector<std::unique_ptr<Communicator>> make_local_group(int world, std::span<Backend* const> staging = {});

// This node's ranks of a group that spans the machines of `link`
// (backend/node_link.h): local_ranks threads here, as many on each node,
// global ranks node_rank * local_ranks + i, world nnodes * local_ranks.
// Each collective gathers every rank's input on every rank through the link
// and computes with the in-process group's arithmetic, so the bits are the
// same as one process's ranks; staging as for make_local_group. Communicator
// i must be used by its own thread; the link must not be used by anything
// else while a collective runs. A broken link makes the collective throw
// on every local rank.
class NodeLink;
std::vector<std::unique_ptr<Communicator>> make_node_group(NodeLink& link, int local_ranks,
                                                           std::span<Backend* const> staging = {});

}  // namespace basalt
