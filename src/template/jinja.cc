#include "template/jinja.h"

#include "core/error.h"
#include "template/ast.h"
#include "template/interpreter.h"

namespace basalt {

namespace {

template <typename Json>
std::string render_with(const std::shared_ptr<const jinja::TemplateData>& data, const Json& context,
                        const RenderOptions& options) {
  BASALT_CHECK(data, "render() on a template that was never parsed");
  BASALT_CHECK(context.is_object() || context.is_null(), "template context must be a JSON object, got {}",
               context.type_name());
  jinja::Interpreter interpreter(data, options);
  return interpreter.render(jinja::Value::from_json(context));
}

}  // namespace

JinjaTemplate JinjaTemplate::parse(std::string_view source) {
  JinjaTemplate t;
  t.data_ = jinja::parse_template(source);
  return t;
}

std::string JinjaTemplate::render(const nlohmann::json& context, const RenderOptions& options) const {
  return render_with(data_, context, options);
}

std::string JinjaTemplate::render(const nlohmann::ordered_json& context, const RenderOptions& options) const {
  return render_with(data_, context, options);
}

std::string render_chat_template(const std::string& source, const nlohmann::ordered_json& messages,
                                 bool add_generation_prompt, const nlohmann::ordered_json& extra,
                                 const RenderOptions& options) {
  BASALT_CHECK(extra.is_object() || extra.is_null(), "chat template extra context must be a JSON object");
  nlohmann::ordered_json context = nlohmann::ordered_json::object();
  context["messages"] = messages;
  context["tools"] = nullptr;
  context["documents"] = nullptr;
  context["add_generation_prompt"] = add_generation_prompt;
  if (extra.is_object()) {
    for (auto it = extra.begin(); it != extra.end(); ++it) context[it.key()] = it.value();
  }
  return JinjaTemplate::parse(source).render(context, options);
}

}  // namespace basalt
