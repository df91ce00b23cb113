#include "serve/server.h"

#include "core/error.h"
#include "infer/batch.h"
#include "serve/request.h"
#include "serve/web_assets.h"

#include <httplib.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <ctime>
#include <deque>
#include <mutex>

namespace orchard::serve {
namespace {
using nlohmann::json;

// How often a whole (non-streamed) reply being decoded sends a JSON space:
// the write after a client hung up meets its reset and cancels the
// request, so this bounds the decoding wasted on a client that left (two
// ticks).
constexpr auto kWholeReplyTick = std::chrono::milliseconds(50);
// Connections waiting to be accepted (the kernel caps it at somaxconn).
constexpr int kListenBacklog = 512;

int64_t unix_time() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string new_id(const char* prefix) {
  static std::atomic<uint64_t> counter{0};
  char buf[64];
  std::snprintf(
      buf,
      sizeof buf,
      "%s-%llx%llx",
      prefix,
      (unsigned long long)unix_time(),
      (unsigned long long)++counter);
  return buf;
}

// What the worker hands the HTTP thread: text pieces, then the end.
struct Channel {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::string> pieces;
  bool done = false;
  std::string reason;
  std::atomic<int64_t> tokens{0}; // counted by the worker, read by HTTP
  void push(std::string s) {
    {
      std::lock_guard<std::mutex> lock(mu);
      pieces.push_back(std::move(s));
    }
    cv.notify_all();
  }
  void close(const std::string& why) {
    {
      std::lock_guard<std::mutex> lock(mu);
      done = true;
      reason = why;
    }
    cv.notify_all();
  }
};

} // namespace

struct Server::Impl {
  infer::ChatModel& chat;
  ServeOptions opt;
  httplib::Server http;
  std::unique_ptr<infer::BatchEngine> engine;
  int port = 0;
  int listen_socket = -1; // the bound socket, for its backlog

  Impl(infer::ChatModel& c, ServeOptions o) : chat(c), opt(std::move(o)) {
    engine = std::make_unique<infer::BatchEngine>(
        c.loaded().model, c.loaded().model->device(), opt.max_batch);
    routes();
  }

  // Runs the request through the batch engine. Streams with `emit` per
  // text piece when given; returns the channel when done. `reply`: a chat
  // reply, whose first word does not start with the space a
  // SentencePiece-style token spells it with (a completion continues its
  // prompt, so it keeps that space).
  std::shared_ptr<Channel> start(
      std::vector<int64_t> prompt,
      infer::SamplingOptions s,
      std::shared_ptr<infer::BatchRequest>* out_request,
      bool reply) {
    if (int64_t(prompt.size()) >= engine->max_seq_len())
      throw BadRequest{
          "the prompt is " + std::to_string(prompt.size()) +
              " tokens; this model reads at most " +
              std::to_string(engine->max_seq_len() - 1) +
              ". Send less text (or fewer messages).",
          "messages"};
    auto ch = std::make_shared<Channel>();
    auto r = std::make_shared<infer::BatchRequest>();
    r->prompt = std::move(prompt);
    s.stop_tokens.insert(
        s.stop_tokens.end(),
        chat.stop_tokens().begin(),
        chat.stop_tokens().end());
    r->options = s;
    auto utf8 = std::make_shared<infer::Utf8Stream>(
        reply && chat.tokenizer().sentencepiece());
    const auto stops = s.stop_tokens;
    infer::ChatModel* model = &chat;
    r->on_token = [ch, utf8, stops, model](int64_t id) {
      if (std::find(stops.begin(), stops.end(), id) != stops.end())
        return true; // ends the request; not part of the text
      ++ch->tokens;
      std::string text = utf8->push(model->text_of({id}));
      if (!text.empty())
        ch->push(std::move(text));
      return true;
    };
    r->on_done = [ch, utf8](const std::string& reason) {
      std::string rest = utf8->flush();
      if (!rest.empty())
        ch->push(rest);
      ch->close(reason);
    };
    *out_request = r;
    engine->submit(r);
    return ch;
  }

  // The whole reply (non-streamed requests), as JSON; nullopt when
  // generation failed (the error, in ch.reason).
  static std::string whole_text(Channel& ch) {
    std::string all;
    for (auto& p : ch.pieces)
      all += p;
    return all;
  }

  static json whole_reply(
      Channel& ch,
      json envelope,
      const std::function<json(const std::string&, const std::string&)>&
          choices,
      int64_t prompt_tokens) {
    envelope["choices"] =
        choices(whole_text(ch), ch.reason == "length" ? "length" : "stop");
    envelope["usage"] = {
        {"prompt_tokens", prompt_tokens},
        {"completion_tokens", ch.tokens.load()},
        {"total_tokens", prompt_tokens + ch.tokens.load()}};
    return envelope;
  }

  // A non-streamed reply. The handler waits for the first token (or the
  // end), so a failure to start (the prompt's prefill) is still a 500.
  // Then the body is sent as it is chunked: a space (insignificant in JSON)
  // every quarter second until the reply is whole, so a client that hung up
  // is noticed by the failed write and its request leaves the batch, as a
  // streamed one does. A failure after the first token is an error body.
  void reply_whole(
      httplib::Response& res,
      std::shared_ptr<Channel> ch,
      std::shared_ptr<infer::BatchRequest> request,
      json envelope,
      std::function<json(const std::string&, const std::string&)> choices,
      int64_t prompt_tokens) {
    {
      std::unique_lock<std::mutex> lock(ch->mu);
      ch->cv.wait(lock, [&] { return ch->done || ch->tokens > 0; });
      if (ch->done) {
        if (ch->reason.rfind("error: ", 0) == 0) {
          res.status = 500;
          res.set_content(
              error_body(ch->reason.substr(7), "", "server_error"),
              "application/json");
        } else {
          res.set_content(
              whole_reply(*ch, envelope, choices, prompt_tokens)
                  .dump(-1, ' ', false, kReplace),
              "application/json");
        }
        return;
      }
    }
    res.set_chunked_content_provider(
        "application/json",
        [ch, request, envelope, choices, prompt_tokens](
            size_t, httplib::DataSink& sink) {
          std::unique_lock<std::mutex> lock(ch->mu);
          ch->cv.wait_for(lock, kWholeReplyTick, [&] { return ch->done; });
          if (!ch->done) {
            lock.unlock();
            if (!sink.write(" ", 1)) {
              request->cancelled = true;
              return false;
            }
            return true;
          }
          const std::string body = ch->reason.rfind("error: ", 0) == 0
              ? error_body(ch->reason.substr(7), "", "server_error")
              : whole_reply(*ch, envelope, choices, prompt_tokens)
                    .dump(-1, ' ', false, kReplace);
          lock.unlock();
          sink.write(body.data(), body.size());
          sink.done();
          return true;
        },
        [request](bool) { request->cancelled = true; });
  }

  // Server-sent events: one `data:` line per piece from `chunk`, then the
  // final chunk, the usage chunk when asked for (stream_options), and
  // [DONE]. A failed write (the client left) cancels.
  void stream(
      httplib::Response& res,
      std::shared_ptr<Channel> ch,
      std::shared_ptr<infer::BatchRequest> request,
      std::function<json(const std::string* text, const std::string* finish)>
          chunk,
      std::function<json(int64_t completion_tokens)> usage_chunk) {
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [ch, request, chunk, usage_chunk](size_t, httplib::DataSink& sink) {
          auto send = [&](const std::string& data) {
            std::string event = "data: " + data + "\n\n";
            if (!sink.write(event.data(), event.size())) {
              request->cancelled = true;
              return false;
            }
            return true;
          };
          std::unique_lock<std::mutex> lock(ch->mu);
          ch->cv.wait_for(lock, std::chrono::milliseconds(250), [&] {
            return ch->done || !ch->pieces.empty();
          });
          std::deque<std::string> pieces;
          pieces.swap(ch->pieces);
          const bool done = ch->done;
          const std::string reason = ch->reason;
          lock.unlock();
          if (pieces.empty() && !done && !sink.is_writable()) {
            request->cancelled = true;
            return false;
          }
          for (const auto& p : pieces)
            if (!send(chunk(&p, nullptr).dump(-1, ' ', false, kReplace)))
              return false;
          if (done) {
            if (reason.rfind("error: ", 0) == 0) {
              send(json::parse(error_body(reason.substr(7), "", "server_error"))
                       .dump(-1, ' ', false, kReplace));
            } else {
              std::string finish = reason == "length" ? "length" : "stop";
              if (!send(chunk(nullptr, &finish).dump(-1, ' ', false, kReplace)))
                return false;
              if (usage_chunk &&
                  !send(usage_chunk(ch->tokens.load())
                            .dump(-1, ' ', false, kReplace)))
                return false;
            }
            send("[DONE]");
            sink.done();
          }
          return true;
        },
        [request](bool) { request->cancelled = true; });
  }

  // The usage chunk that ends a stream with include_usage (OpenAI's shape:
  // no choices).
  static std::function<json(int64_t)> usage_chunk_of(
      bool wanted,
      const std::string& id,
      const char* object,
      int64_t created,
      const std::string& model,
      int64_t prompt_tokens) {
    if (!wanted)
      return nullptr;
    return [=](int64_t completion_tokens) {
      return json{
          {"id", id},
          {"object", object},
          {"created", created},
          {"model", model},
          {"choices", json::array()},
          {"usage",
           {{"prompt_tokens", prompt_tokens},
            {"completion_tokens", completion_tokens},
            {"total_tokens", prompt_tokens + completion_tokens}}}};
    };
  }

  void chat_completions(const std::string& text, httplib::Response& res) {
    json body = parse_body(text);
    auto messages = messages_of(body, opt);
    bool streaming = false, include_usage = false;
    auto s = sampling_of(body, opt, &streaming, &include_usage);
    auto prompt = chat.prompt_ids(messages);
    const int64_t prompt_tokens = int64_t(prompt.size());
    std::shared_ptr<infer::BatchRequest> request;
    auto ch = start(std::move(prompt), s, &request, /*reply=*/true);
    const std::string id = new_id("chatcmpl");
    const int64_t created = unix_time();
    const std::string model = opt.model_name;
    if (streaming) {
      auto first = std::make_shared<bool>(true);
      stream(
          res,
          ch,
          request,
          [=](const std::string* text, const std::string* finish) {
            json delta = json::object();
            if (*first) {
              delta["role"] = "assistant";
              *first = false;
            }
            if (text)
              delta["content"] = *text;
            return json{
                {"id", id},
                {"object", "chat.completion.chunk"},
                {"created", created},
                {"model", model},
                {"choices",
                 json::array(
                     {{{"index", 0},
                       {"delta", delta},
                       {"finish_reason",
                        finish ? json(*finish) : json(nullptr)}}})}};
          },
          usage_chunk_of(
              include_usage,
              id,
              "chat.completion.chunk",
              created,
              model,
              prompt_tokens));
      return;
    }
    reply_whole(
        res,
        ch,
        request,
        {{"id", id},
         {"object", "chat.completion"},
         {"created", created},
         {"model", model}},
        [](const std::string& text, const std::string& finish) {
          return json::array(
              {{{"index", 0},
                {"message", {{"role", "assistant"}, {"content", text}}},
                {"finish_reason", finish}}});
        },
        prompt_tokens);
  }

  void completions(const std::string& text, httplib::Response& res) {
    json body = parse_body(text);
    if (!body.contains("prompt"))
      throw BadRequest{"prompt is required.", "prompt"};
    std::string prompt_text;
    const json& p = body["prompt"];
    if (p.is_string())
      prompt_text = p.get<std::string>();
    else if (p.is_array() && p.size() == 1 && p[0].is_string())
      prompt_text = p[0].get<std::string>();
    else
      throw BadRequest{"prompt must be a string.", "prompt"};
    if (prompt_text.size() > opt.max_message_chars)
      throw BadRequest{
          "prompt is " + std::to_string(prompt_text.size()) +
              " characters; this server accepts at most " +
              std::to_string(opt.max_message_chars) + ".",
          "prompt"};
    bool streaming = false, include_usage = false;
    auto s = sampling_of(body, opt, &streaming, &include_usage);
    const auto& tok = chat.tokenizer();
    std::vector<int64_t> prompt;
    if (auto bos = tok.document_start()) {
      prompt.push_back(*bos);
      s.stop_tokens.push_back(*bos);
    }
    for (auto id : tok.document_ends())
      s.stop_tokens.push_back(id);
    for (auto id : tok.encode(prompt_text))
      prompt.push_back(id);
    const int64_t prompt_tokens = int64_t(prompt.size());
    std::shared_ptr<infer::BatchRequest> request;
    auto ch = start(std::move(prompt), s, &request, /*reply=*/false);
    const std::string id = new_id("cmpl");
    const int64_t created = unix_time();
    const std::string model = opt.model_name;
    auto choice = [](const std::string& text, json finish) {
      return json::array(
          {{{"index", 0},
            {"text", text},
            {"logprobs", nullptr},
            {"finish_reason", finish}}});
    };
    if (streaming) {
      stream(
          res,
          ch,
          request,
          [=](const std::string* text, const std::string* finish) {
            return json{
                {"id", id},
                {"object", "text_completion"},
                {"created", created},
                {"model", model},
                {"choices",
                 choice(
                     text ? *text : "",
                     finish ? json(*finish) : json(nullptr))}};
          },
          usage_chunk_of(
              include_usage,
              id,
              "text_completion",
              created,
              model,
              prompt_tokens));
      return;
    }
    reply_whole(
        res,
        ch,
        request,
        {{"id", id},
         {"object", "text_completion"},
         {"created", created},
         {"model", model}},
        [choice](const std::string& text, const std::string& finish) {
          return choice(text, finish);
        },
        prompt_tokens);
  }

  // Runs a handler on the request's body; a BadRequest becomes its status
  // and error body. The body is read here, whatever its Content-Type:
  // clients such as `curl -d` send JSON as form data, whose bodies
  // cpp-httplib would otherwise cap at 8 KB (with a 413), far below
  // max_body_bytes.
  template <class F>
  httplib::Server::HandlerWithContentReader guarded(F f) {
    return [this, f](
               const httplib::Request& req,
               httplib::Response& res,
               const httplib::ContentReader& content) {
      try {
        if (req.is_multipart_form_data())
          throw BadRequest{
              "send the request as a JSON body (Content-Type: "
              "application/json), not multipart form data.",
              "",
              415};
        std::string body;
        const bool whole = content([&](const char* data, size_t n) {
          body.append(data, n);
          return true;
        });
        if (!whole)
          return; // too large (413) or cut short: cpp-httplib set the status
        (this->*f)(body, res);
      } catch (const BadRequest& e) {
        res.status = e.status;
        res.set_content(error_body(e.message, e.param), "application/json");
      } catch (const UserError& e) {
        res.status = 400;
        res.set_content(error_body(e.what()), "application/json");
      }
    };
  }

  void routes() {
    // cpp-httplib reads a body past this to its end, dropped, before its
    // 413, so a client still sending gets the answer.
    http.set_payload_max_length(opt.max_body_bytes);
    // Not cpp-httplib's default, which adds SO_REUSEPORT: with it a second
    // server would share a port that is in use, and requests would
    // alternate between two models.
    http.set_socket_options([this](auto sock) {
      listen_socket = int(sock);
      int yes = 1;
      ::setsockopt(
          sock,
          SOL_SOCKET,
          SO_REUSEADDR,
          reinterpret_cast<const char*>(&yes),
          sizeof yes);
    });
    // One line per request on stderr.
    if (opt.log_requests)
      http.set_logger(
          [](const httplib::Request& req, const httplib::Response& res) {
            std::time_t now = std::time(nullptr);
            char when[32];
            std::strftime(when, sizeof when, "%H:%M:%S", std::localtime(&now));
            std::fprintf(
                stderr,
                "%s %s %s %d\n",
                when,
                req.method.c_str(),
                req.path.c_str(),
                res.status);
          });
    const int threads = opt.threads;
    http.new_task_queue = [threads] {
      return new httplib::ThreadPool(size_t(threads));
    };
    http.set_pre_routing_handler(
        [this](const httplib::Request& req, httplib::Response& res) {
          if (opt.api_key.empty() || req.path.rfind("/v1/", 0) != 0)
            return httplib::Server::HandlerResponse::Unhandled;
          if (req.get_header_value("Authorization") == "Bearer " + opt.api_key)
            return httplib::Server::HandlerResponse::Unhandled;
          res.status = 401;
          res.set_header("WWW-Authenticate", "Bearer");
          res.set_content(
              error_body(
                  "this server wants an API key: send the header "
                  "'Authorization: Bearer <key>' (the key given to orchard "
                  "serve --api-key).",
                  "",
                  "invalid_request_error"),
              "application/json");
          return httplib::Server::HandlerResponse::Handled;
        });
    http.set_error_handler(
        [](const httplib::Request& req, httplib::Response& res) {
          if (!res.body.empty())
            return;
          std::string message;
          if (res.status == 413)
            message = "the request body is too large for this server.";
          else if (res.status == 404)
            message = "no route " + req.method + " " + req.path +
                "; see GET /v1/models, POST /v1/chat/completions, POST "
                "/v1/completions, GET /health.";
          else
            message = "HTTP " + std::to_string(res.status) + ".";
          res.set_content(error_body(message), "application/json");
        });
    http.set_exception_handler([](const httplib::Request&,
                                  httplib::Response& res,
                                  std::exception_ptr ep) {
      std::string what = "internal error";
      try {
        std::rethrow_exception(ep);
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
      }
      res.status = 500;
      res.set_content(
          error_body(what.substr(0, what.find('\n')), "", "server_error"),
          "application/json");
    });
    http.Get("/", [](const httplib::Request&, httplib::Response& res) {
      const std::string* page = web_asset("chat.html");
      res.set_content(
          page ? *page : "chat page missing", "text/html; charset=utf-8");
    });
    http.Get(
        "/health", [this](const httplib::Request&, httplib::Response& res) {
          auto st = engine->stats();
          res.set_content(
              json{
                  {"status", "ok"},
                  {"model", opt.model_name},
                  {"active", engine->active()},
                  {"queued", engine->queued()},
                  {"requests", st.requests},
                  {"decode_steps", st.steps},
                  {"cancelled", st.cancelled},
                  {"largest_batch", st.max_rows}}
                  .dump(-1, ' ', false, kReplace),
              "application/json");
        });
    http.Get(
        "/v1/models", [this](const httplib::Request&, httplib::Response& res) {
          res.set_content(
              json{
                  {"object", "list"},
                  {"data",
                   json::array(
                       {{{"id", opt.model_name},
                         {"object", "model"},
                         {"created", 0},
                         {"owned_by", "orchard"}}})}}
                  .dump(-1, ' ', false, kReplace),
              "application/json");
        });
    http.Post("/v1/chat/completions", guarded(&Impl::chat_completions));
    http.Post("/v1/completions", guarded(&Impl::completions));
  }
};

Server::Server(infer::ChatModel& chat, ServeOptions options)
    : impl_(std::make_unique<Impl>(chat, std::move(options))) {}

Server::~Server() {
  stop();
}

int Server::bind() {
  auto& o = impl_->opt;
  if (o.port == 0) {
    impl_->port = impl_->http.bind_to_any_port(o.host);
  } else {
    impl_->port = impl_->http.bind_to_port(o.host, o.port) ? o.port : -1;
  }
  // cpp-httplib listens with a backlog of 5: when more clients connect at
  // once than that, the kernel answers with SYN cookies and resets the
  // connections it has no room to queue (seen with 64 clients on loopback:
  // requests reset mid-body, streams that never started). Listening again
  // on the bound socket enlarges its queue.
  if (impl_->port > 0 && impl_->listen_socket >= 0)
    ::listen(impl_->listen_socket, kListenBacklog);
  if (impl_->port <= 0)
    throw UserError(
        "cannot listen on " + o.host + ":" + std::to_string(o.port) +
        " (in use, or not an address of this machine); choose another with "
        "--port or --host.");
  return impl_->port;
}

void Server::run() {
  impl_->http.listen_after_bind();
}

void Server::stop() {
  if (impl_ && impl_->http.is_running())
    impl_->http.stop();
}

} // namespace orchard::serve
