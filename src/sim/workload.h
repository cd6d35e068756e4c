// The simulator's requests, made by the same code `basalt bench` sends
// (loadgen/workload.h for the conversations, loadgen/schedule.h for the
// arrivals), so a simulated run and a real one replay the same trace.
//
// Contract:
//  * requests_from(pool, arrivals): request k arrives at arrivals[k] and has
//    the lengths of pool[k mod pool size] (the pool is cycled, so a long
//    trace reuses a few thousand generated conversations): prompt = the
//    leading messages' tokens + the question's, output = max_tokens (what
//    `--ignore-eos` makes the server produce). Conversations with the same
//    leading text form one shared-prefix group (its tokens the prefix).
//    A multi-turn conversation, an empty pool with arrivals, or a
//    conversation without a turn is a basalt::Error.
//  * trace_arrivals(shape, count, duration_s): arrival_times of `count`
//    requests, or, with duration_s > 0 (count then ignored), the arrivals
//    of the shape's process up to duration_s.
#pragma once

#include <cstdint>
#include <vector>

#include "loadgen/schedule.h"
#include "loadgen/workload.h"
#include "sim/fleet.h"

namespace basalt::sim {

std::vector<SimRequest> requests_from(const std::vector<loadgen::Conversation>& pool,
                                      const std::vector<double>& arrivals);

std::vector<double> trace_arrivals(const loadgen::LoadShape& shape, int64_t count, double duration_s);

}  // namespace basalt::sim
