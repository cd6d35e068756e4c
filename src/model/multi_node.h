// Tensor parallelism over the ranks of several machines (`--nnodes N`), as
// SGLang runs a model too large for one host: node k holds ranks [k * L,
// (k + 1) * L) of the N * L, each node a TensorParallelModel of its L ranks
// (model/tensor_parallel.h) whose communicators span every node
// (make_node_group over a NodeLink, backend/node_link.h). Node 0, the
// leader, runs the engine (scheduler, radix cache, sampling, the server);
// the other nodes run their ranks' part of every call the leader makes.
//
// Contract:
//  * make_multi_node_leader(link, local, backend) is node 0's Model (backend:
//    its first rank's, which copies a batch's device tensors to the host
//    to send them): each call
//    (forward, allocate_kv, prepare, and the draft head's allocate_kv and
//    forward when the model has one) first checks what only the leader
//    sees (its output tensors, as the tensor-parallel model checks them
//    before any rank starts), then sends the call and its batch to the
//    other nodes (one exchange), runs its own ranks, and then learns each
//    node's outcome (one more exchange): an error on any node is thrown
//    to the caller, naming the node. With the same batch on every rank, an
//    error that depends on the batch happens on every rank before its
//    first collective, so nothing is left waiting. The other nodes hold
//    their own KV: one allocation of the model's KV and one of the draft
//    head's is live at a time (a later allocate_kv replaces the earlier on
//    every node, and a call with the earlier one is refused). Destroying
//    the leader tells the other nodes to stop.
//  * serve_multi_node_worker(link, local, backend) is what a node other
//    than 0 runs: it carries out the leader's calls on its own ranks
//    (`backend` is its first rank's, for its scratch outputs) until the
//    leader says stop (it returns) or the link breaks (it throws).
//  * Neither runs graphs (the node group cannot be recorded) nor DP
//    attention; a link of one node is the plain tensor-parallel model.
#pragma once

#include <memory>

#include "model/model.h"

namespace basalt {

class NodeLink;

std::unique_ptr<Model> make_multi_node_leader(std::unique_ptr<NodeLink> link, std::unique_ptr<Model> local,
                                              Backend& backend);
void serve_multi_node_worker(NodeLink& link, Model& local, Backend& backend);

}  // namespace basalt
