// A request's prompt as the engine gets it: the chat template's text for a
// chat, the ids after truncate_prompt_tokens. Shared by `basalt serve`
// (server/api_server.cc) and the gateway's exact cache-aware routing
// (router/), which must tokenize a request exactly as its replicas do for
// their KV events' block hashes to match its own.
//
// Contract:
//  * render_chat_prompt: the request's own chat_template, else the
//    tokenizer config's, rendered over the messages as transformers'
//    apply_chat_template does (bos_token and eos_token from the config, then
//    the request's template kwargs over them); continue_final_message cuts
//    the text after the last message's content. Throws ApiError 400 when
//    there is no template or the template raises.
//  * truncate_prompt: keeps the last `truncate` ids (truncate_prompt_tokens;
//    negative: max_model_len - 1; 0: all).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "server/openai_protocol.h"
#include "tokenizer/tokenizer.h"

namespace basalt {

std::string render_chat_prompt(const ParsedRequest& r, const TokenizerConfig& config);
void truncate_prompt(std::vector<int32_t>& ids, int64_t truncate, int64_t max_model_len);

}  // namespace basalt
