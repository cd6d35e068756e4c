// warm_up: a server's first work, done before it takes requests, so that
// its first requests do not pay for what a device does once: kernels
// loaded on their first launch, GEMM plans chosen per shape, memory first
// allocated (vLLM's dummy runs and SGLang's warm-up request serve the
// same end). CUDA graphs of decode steps are recorded earlier, when the
// engine is built (model/graphed_model.h, prepare()).
//
// Contract: submits synthetic requests through the engine's normal path,
// all at once: one prompt of each power-of-two length from 1 token up to
// max_prompt_tokens (random ids, a fixed seed; a prompt longer than the
// step budget is prefilled in chunks), each decoding decode_tokens tokens
// greedily, so prefills of many sizes, mixed steps and decode batches of
// every size up to their count all run. It waits for them, then empties
// the radix cache of their prompts (KV-event subscribers see those blocks
// come and go). max_prompt_tokens is lowered so that the prompts fit in
// half the KV pool and under the model's context length. A request that
// fails makes warm_up throw basalt::Error with its message. The warm-up's
// requests count in the engine's metrics like any others.
#pragma once

#include <cstdint>

#include "runtime/engine.h"

namespace basalt {

struct WarmupOptions {
  int64_t max_prompt_tokens = 4096;
  int decode_tokens = 8;
};

struct WarmupReport {
  int requests = 0;
  int64_t prompt_tokens = 0;     // in all
  int64_t longest_prompt = 0;
  int64_t output_tokens = 0;
  double seconds = 0;
};

WarmupReport warm_up(Engine& engine, const WarmupOptions& options = {});

}  // namespace basalt
