#include "server/chat_prompt.h"

#include <algorithm>
#include <fmt/format.h>

#include "core/error.h"
#include "template/jinja.h"

namespace basalt {

std::string render_chat_prompt(const ParsedRequest& r, const TokenizerConfig& config) {
  const std::string& source = !r.chat_template.empty() ? r.chat_template : config.chat_template;
  if (source.empty())
    throw ApiError(400, "this model has no chat template; use /v1/completions or pass 'chat_template'");
  nlohmann::ordered_json extra = r.template_kwargs;
  if (config.bos_token) extra["bos_token"] = *config.bos_token;
  if (config.eos_token) extra["eos_token"] = *config.eos_token;
  for (auto it = r.template_kwargs.begin(); it != r.template_kwargs.end(); ++it) extra[it.key()] = it.value();
  std::string text;
  try {
    text = render_chat_template(source, r.messages, r.add_generation_prompt, extra);
  } catch (const Error& e) {
    throw ApiError(400, fmt::format("chat template error: {}", e.what()), "messages");
  }
  if (r.continue_final_message) {
    // Cut after the final message's content, so the model continues it.
    const nlohmann::ordered_json& last = r.messages.back();
    const std::string content = last["content"].is_string() ? last["content"].get<std::string>() : "";
    const size_t at = content.empty() ? std::string::npos : text.rfind(content);
    if (at != std::string::npos) text.resize(at + content.size());
  }
  return text;
}

void truncate_prompt(std::vector<int32_t>& ids, int64_t truncate, int64_t max_model_len) {
  if (truncate == 0) return;
  const int64_t keep = std::max<int64_t>(0, truncate < 0 ? max_model_len - 1 : truncate);
  if (static_cast<int64_t>(ids.size()) > keep) ids.erase(ids.begin(), ids.end() - keep);
}

}  // namespace basalt
