// `orchard serve`: the web chat page and an OpenAI-compatible API over one
// trained chat model.
//
//   GET  /                      the chat page (web/chat.html, built in)
//   GET  /health                {"status": "ok", ...}
//   GET  /v1/models             the one model
//   POST /v1/chat/completions   messages -> reply; "stream": true sends
//                               server-sent events (chat.completion.chunk)
//   POST /v1/completions        prompt -> continuation (text_completion)
//
// Requests go to a BatchEngine (infer/batch.h): several clients decode
// together. With an API key every /v1 route wants `Authorization: Bearer
// KEY` (401 otherwise). Limits (messages per request, characters per
// message, max_tokens, temperature and top_p ranges) give 400 with an
// OpenAI-style error naming the field; malformed JSON 400; a body over
// max_body_bytes 413. A client that goes away mid-stream is cancelled
// before the next decoding step.
#pragma once

#include "infer/chat.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace orchard::serve {

struct ServeOptions {
  std::string host = "127.0.0.1";
  int port = 8000;        // 0: any free port (tests)
  std::string api_key;    // "": no authentication
  std::string model_name; // the id /v1/models reports
  int64_t max_batch = 8;  // requests decoded together
  size_t max_messages = 64;
  size_t max_message_chars = 16000;
  int64_t max_tokens_limit = 2048; // largest max_tokens accepted
  int64_t default_max_tokens = 256;
  size_t max_body_bytes = 1 << 20;
  // Connections served at once (a stream holds one): room for 64 streams
  // and the /health and page requests beside them.
  int threads = 128;
  bool log_requests = true; // one line per request on stderr
};

class Server {
 public:
  // `chat` must outlive the server.
  Server(infer::ChatModel& chat, ServeOptions options);
  ~Server();
  // Binds; returns the port (the chosen one for port 0). UserError when
  // the address cannot be bound.
  int bind();
  // Serves until stop() (from another thread or a signal handler).
  void run();
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

} // namespace orchard::serve
