// Reading an OpenAI-style request (src/serve/server.cpp routes them): the
// body as a JSON object, the conversation, the sampling fields, and the
// error a client gets when one is wrong. Every problem is a BadRequest
// naming the field, which the server answers with its status and an
// OpenAI-style error body.
#pragma once

#include "infer/engine.h"
#include "serve/server.h"
#include "text/conversation.h"

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace orchard::serve {

// Text from a model can hold any bytes (chat.h's Utf8Stream already
// replaces what is not UTF-8; this keeps a dump from ever throwing).
inline constexpr auto kReplace = nlohmann::json::error_handler_t::replace;

// A request the client got wrong: 400 (or `status`) with the field it
// names.
struct BadRequest {
  std::string message, param;
  int status = 400;
};

// {"error": {"message", "type", "param", "code"}}.
std::string error_body(
    const std::string& message,
    const std::string& param = "",
    const std::string& type = "invalid_request_error");

// The body as a JSON object.
nlohmann::json parse_body(const std::string& text);

// `messages`: roles system/user/assistant (developer as system), string or
// text-part content, within the server's limits, ending with the user.
std::vector<text::Message> messages_of(
    const nlohmann::json& body,
    const ServeOptions& opt);

// The sampling fields both completion routes share; `stream` and
// `include_usage` (stream_options) are set from the body.
infer::SamplingOptions sampling_of(
    const nlohmann::json& body,
    const ServeOptions& opt,
    bool* stream,
    bool* include_usage);

} // namespace orchard::serve
