// The load-test driver: sends a workload's requests on an arrival schedule
// with a concurrency limit, through one CompletionClient on one thread.
//
// Contract:
//  * run_load runs the io_context on the calling thread until every request
//    has finished (or failed) and returns one RequestRecord per request sent,
//    in the order they were sent. Nothing it gets from the server throws;
//    errors are recorded in the record's result.
//  * Conversation i starts at arrival_times(conversations, shape)[i]; later
//    turns of a conversation are sent as soon as the previous turn's answer
//    has streamed in full (their question follows that answer); a turn that
//    fails ends its conversation (the rest are counted in
//    abandoned_turns). At most max_concurrency requests are in flight
//    (0: no limit); requests due while the limit is reached wait in arrival
//    order.
//  * Arrival lag is measured, in runs with a finite rate, for requests that
//    were sent on their schedule (not held by the concurrency limit, not a
//    follow-up turn): the time
//    from when they were due to when the client started sending them. A
//    large lag means the client itself could not keep up.
//  * The process's CPU time (getrusage, user + system) over the run is
//    reported, as is the wall time from the start to the last answer.
//  * Progress: when progress is on, a bar redrawn in place on stderr when
//    stderr is a terminal, otherwise one plain line every 10 seconds.
//  * build_body makes the JSON body of one request: /v1/chat/completions
//    gets messages (leading messages, then each earlier question and its
//    answer, then the question); /v1/completions gets a prompt, those texts
//    joined with blank lines. Both get max_tokens, stream, and as asked
//    model, temperature, ignore_eos and stream_options.include_usage.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loadgen/client.h"
#include "loadgen/schedule.h"
#include "loadgen/workload.h"

namespace basalt::loadgen {

struct RunOptions {
  std::string path = "/v1/completions";
  bool chat = false;
  std::string model;        // empty: no "model" field
  bool ignore_eos = false;
  bool include_usage = true;
  double temperature = 0;   // < 0: not sent
  int64_t max_concurrency = 0;
  LoadShape shape;
  bool progress = false;
  std::string label;        // shown in progress lines
};

struct RequestRecord {
  int64_t conversation = 0;
  int64_t turn = 0;
  double scheduled_s = 0;   // when due (follow-up turns: when the previous one ended)
  bool on_schedule = true;  // sent when due, not held by the limit nor a follow-up
  double lag_s = 0;         // on_schedule only: sent_s - scheduled_s
  int64_t input_tokens = 0; // the client's count of the prompt text
  int64_t max_tokens = 0;
  ExchangeResult result;
};

struct RunResult {
  std::vector<RequestRecord> records;
  double wall_s = 0;
  double cpu_user_s = 0;
  double cpu_system_s = 0;
  int64_t abandoned_turns = 0;
  int64_t held_by_limit = 0;  // requests that waited for a free slot
};

std::string build_body(const Conversation& conversation, size_t turn, const std::vector<std::string>& answers,
                       const RunOptions& options);

RunResult run_load(boost::asio::io_context& io, CompletionClient& client, const std::vector<Conversation>& conversations,
                   const RunOptions& options);

}  // namespace basalt::loadgen
