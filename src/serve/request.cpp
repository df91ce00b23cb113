#include "serve/request.h"

#include "core/error.h"

#include <chrono>
#include <cstdint>

namespace orchard::serve {
using nlohmann::json;

// An OpenAI-style error body.
std::string error_body(
    const std::string& message,
    const std::string& param,
    const std::string& type) {
  json e = {{"message", message}, {"type", type}, {"code", nullptr}};
  e["param"] = param.empty() ? json(nullptr) : json(param);
  return json{{"error", e}}.dump(-1, ' ', false, kReplace);
}

// The sampling fields both completion routes share.
infer::SamplingOptions sampling_of(
    const json& body,
    const ServeOptions& opt,
    bool* stream,
    bool* include_usage) {
  infer::SamplingOptions s;
  s.temperature = 1.0; // OpenAI's default
  s.top_k = 0;
  s.max_new_tokens = opt.default_max_tokens;
  s.seed =
      uint64_t(std::chrono::steady_clock::now().time_since_epoch().count());
  auto number = [&](const char* key, double lo, double hi, double& out) {
    if (!body.contains(key) || body[key].is_null())
      return;
    if (!body[key].is_number())
      throw BadRequest{std::string(key) + " must be a number.", key};
    double v = body[key].get<double>();
    if (!(v >= lo && v <= hi))
      throw BadRequest{
          std::string(key) + " must be between " +
              json(lo).dump(-1, ' ', false, kReplace) + " and " +
              json(hi).dump(-1, ' ', false, kReplace) + "; got " +
              json(v).dump(-1, ' ', false, kReplace) + ".",
          key};
    out = v;
  };
  auto integer = [&](const char* key, int64_t lo, int64_t hi, int64_t& out) {
    if (!body.contains(key) || body[key].is_null())
      return;
    if (!body[key].is_number_integer())
      throw BadRequest{std::string(key) + " must be an integer.", key};
    int64_t v = body[key].get<int64_t>();
    if (v < lo || v > hi)
      throw BadRequest{
          std::string(key) + " must be between " + std::to_string(lo) +
              " and " + std::to_string(hi) + "; got " + std::to_string(v) + ".",
          key};
    out = v;
  };
  number("temperature", 0, infer::kMaxTemperature, s.temperature);
  number("top_p", 1e-9, 1, s.top_p);
  number("min_p", 0, 1, s.min_p);
  number("repetition_penalty", 1e-9, infer::kMaxPenalty, s.repetition_penalty);
  integer("top_k", 0, infer::kMaxTopK, s.top_k);
  integer("max_tokens", 1, opt.max_tokens_limit, s.max_new_tokens);
  integer("max_completion_tokens", 1, opt.max_tokens_limit, s.max_new_tokens);
  int64_t seed = 0;
  if (body.contains("seed") && !body["seed"].is_null()) {
    integer("seed", INT64_MIN, INT64_MAX, seed);
    s.seed = uint64_t(seed);
  }
  int64_t n = 1;
  integer("n", 1, 1, n);
  // OpenAI clients send "stop": [] (or "") for none; stop strings are not
  // supported.
  const json stop = body.value("stop", json(nullptr));
  const bool no_stop = stop.is_null() || (stop.is_array() && stop.empty()) ||
      (stop.is_string() && stop.get_ref<const std::string&>().empty());
  if (!no_stop)
    throw BadRequest{
        "stop sequences are not supported by this server; leave out "
        "\"stop\" (replies end at the model's end-of-turn token).",
        "stop"};
  *stream = false;
  if (body.contains("stream") && !body["stream"].is_null()) {
    if (!body["stream"].is_boolean())
      throw BadRequest{"stream must be true or false.", "stream"};
    *stream = body["stream"].get<bool>();
  }
  // stream_options: {"include_usage": true} adds a last chunk with usage.
  *include_usage = false;
  const json so = body.value("stream_options", json(nullptr));
  if (!so.is_null()) {
    if (!so.is_object())
      throw BadRequest{
          "stream_options must be an object such as {\"include_usage\": "
          "true}.",
          "stream_options"};
    if (!*stream)
      throw BadRequest{
          "stream_options is only allowed with \"stream\": true.",
          "stream_options"};
    const json iu = so.value("include_usage", json(false));
    if (!iu.is_boolean())
      throw BadRequest{
          "stream_options.include_usage must be true or false.",
          "stream_options.include_usage"};
    *include_usage = iu.get<bool>();
  }
  return s;
}

json parse_body(const std::string& text) {
  json body = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded())
    throw BadRequest{
        "the request body is not valid JSON (" + std::to_string(text.size()) +
            " bytes).",
        ""};
  if (!body.is_object())
    throw BadRequest{"the request body must be a JSON object.", ""};
  return body;
}

std::vector<text::Message> messages_of(
    const json& body,
    const ServeOptions& opt) {
  if (!body.contains("messages"))
    throw BadRequest{"messages is required.", "messages"};
  const json& ms = body["messages"];
  if (!ms.is_array() || ms.empty())
    throw BadRequest{
        "messages must be a non-empty array of {role, content}.", "messages"};
  if (ms.size() > opt.max_messages)
    throw BadRequest{
        "messages holds " + std::to_string(ms.size()) +
            " messages; this server accepts at most " +
            std::to_string(opt.max_messages) + ".",
        "messages"};
  std::vector<text::Message> out;
  for (size_t i = 0; i < ms.size(); ++i) {
    const std::string where = "messages[" + std::to_string(i) + "]";
    const json& m = ms[i];
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
      throw BadRequest{where + " needs a string role.", where + ".role"};
    std::string role = m["role"].get<std::string>();
    if (role == "developer")
      role = "system";
    if (role != "system" && role != "user" && role != "assistant")
      throw BadRequest{
          where + ".role is '" + role + "'; use system, user or assistant.",
          where + ".role"};
    std::string content;
    const json c = m.value("content", json(nullptr));
    if (c.is_string()) {
      content = c.get<std::string>();
    } else if (c.is_array()) { // [{"type": "text", "text": ...}]
      for (const auto& part : c) {
        if (!part.is_object() ||
            part.value("type", json(nullptr)) != json("text") ||
            !part.contains("text") || !part["text"].is_string())
          throw BadRequest{
              where +
                  ".content parts must be {\"type\": \"text\", "
                  "\"text\": ...}; this model reads only text.",
              where + ".content"};
        content += part["text"].get<std::string>();
      }
    } else {
      throw BadRequest{
          where + ".content must be a string.", where + ".content"};
    }
    if (content.size() > opt.max_message_chars)
      throw BadRequest{
          where + ".content is " + std::to_string(content.size()) +
              " characters; this server accepts at most " +
              std::to_string(opt.max_message_chars) + " per message.",
          where + ".content"};
    out.push_back({role, content});
  }
  if (out.back().role == "assistant")
    throw BadRequest{
        "the last message is the assistant's; end with a user message.",
        "messages"};
  return out;
}

} // namespace orchard::serve
