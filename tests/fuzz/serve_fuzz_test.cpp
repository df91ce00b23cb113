// `orchard serve` fed mutated HTTP requests over loopback: JSON bodies
// mutated by structure (serve/request.cpp's reader: messages, roles,
// sampling fields), request lines and headers spliced with what breaks
// HTTP parsers (bad or huge Content-Length, chunk sizes, duplicate and
// endless headers), raw bytes flipped, and slow clients that send a request
// a few bytes at a time. Every input must end in an answer that is not a
// 5xx, or in the server closing the connection, within a time limit; and
// the server must still answer /health after it. A 5xx, a hang, a crash or
// a server that stops answering fails the campaign and prints the input.
#include "fuzz/fuzz_harness.h"
#include "serve_test_util.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <stdexcept>
#include <thread>

namespace orchard::fuzz {
namespace {

using nlohmann::json;

// How long one input may take before it counts as a hang: the server
// answers a malformed request at once, and a valid one decodes at most the
// test model's 128 positions.
constexpr int kAnswerTimeoutMs = 10'000;

// Sends `request` (in pieces of `piece` bytes, `pause_ms` apart, for a slow
// client; whole when piece is 0) and reads the answer: until the server
// closes, or, once an answer's head has come, until nothing more comes for
// kIdleMs (a kept-alive connection). When nothing comes at first, the
// sending side is closed: an incomplete request then ends at once instead
// of at the server's read timeout. Throws std::runtime_error (a campaign
// failure) when bytes still flow, or nothing came, after kAnswerTimeoutMs.
constexpr int kIdleMs = 250;
std::string exchange(
    int port,
    const std::string& request,
    size_t piece = 0,
    int pause_ms = 0) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0)
    throw std::runtime_error("[fuzz] no socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(uint16_t(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    throw std::runtime_error("[fuzz] the server refused a connection");
  }
  for (size_t sent = 0; sent < request.size();) {
    const size_t n =
        piece ? std::min(piece, request.size() - sent) : request.size() - sent;
    const ssize_t k = ::send(fd, request.data() + sent, n, MSG_NOSIGNAL);
    if (k <= 0)
      break; // the server closed first; its answer is still read
    sent += size_t(k);
    if (pause_ms)
      std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms));
  }
  using clock = std::chrono::steady_clock;
  const auto deadline =
      clock::now() + std::chrono::milliseconds(kAnswerTimeoutMs);
  std::string got;
  bool half_closed = false;
  char buf[4096];
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - clock::now())
                          .count();
    if (left <= 0) {
      ::close(fd);
      throw std::runtime_error(
          "[fuzz] no end to the answer within " +
          std::to_string(kAnswerTimeoutMs) +
          " ms (a hang); got so far: " + printable(got, 300));
    }
    pollfd p{fd, POLLIN, 0};
    const int wait = int(std::min<int64_t>(left, kIdleMs));
    if (::poll(&p, 1, wait) <= 0) {
      if (got.find("\r\n\r\n") != std::string::npos)
        break; // a whole head and then quiet: a kept-alive connection
      if (!half_closed) {
        ::shutdown(fd, SHUT_WR);
        half_closed = true;
      }
      continue;
    }
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0)
      break;
    got.append(buf, size_t(n));
  }
  ::close(fd);
  return got;
}

// The answer's status code, 0 when it is not an HTTP answer.
int status_of(const std::string& answer) {
  if (answer.rfind("HTTP/1.", 0) != 0 || answer.size() < 12)
    return 0;
  return std::atoi(answer.c_str() + 9);
}

std::string post(const std::string& path, const std::string& body) {
  return "POST " + path +
      " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: "
      "application/json\r\nContent-Length: " +
      std::to_string(body.size()) + "\r\n\r\n" + body;
}

std::string chunked(const std::string& path, const std::string& body) {
  char size[32];
  std::snprintf(size, sizeof size, "%zx", body.size());
  return "POST " + path +
      " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
      "Transfer-Encoding: chunked\r\n\r\n" +
      size + "\r\n" + body + "\r\n0\r\n\r\n";
}

std::vector<std::string> seed_bodies() {
  json chat = {
      {"model", "fuzz"},
      {"messages",
       {{{"role", "system"}, {"content", "Be brief."}},
        {{"role", "user"}, {"content", "What does tree mean?"}}}},
      {"max_tokens", 4},
      {"temperature", 0.7},
      {"top_p", 0.9},
      {"top_k", 20},
      {"seed", 3},
      {"stop", json::array()}}; // stop strings are refused; [] is not
  json streamed = chat;
  streamed["stream"] = true;
  streamed["stream_options"] = {{"include_usage", true}};
  json parts = chat;
  parts["messages"][1]["content"] = {
      {{"type", "text"}, {"text", "What does"}},
      {{"type", "text"}, {"text", " fox mean?"}}};
  json completion = {
      {"model", "fuzz"}, {"prompt", "The quick"}, {"max_tokens", 4}};
  return {chat.dump(), streamed.dump(), parts.dump(), completion.dump()};
}

// What breaks HTTP readers, spliced into the request line and headers.
const std::vector<std::string>& http_dictionary() {
  static const std::vector<std::string> d = {
      "\r\n",
      "\r\n\r\n",
      "Content-Length: 0\r\n",
      "Content-Length: -1\r\n",
      "Content-Length: 18446744073709551615\r\n",
      "Content-Length: 99999999999999999999999\r\n",
      "Content-Length: 5\r\nContent-Length: 7\r\n",
      "Transfer-Encoding: chunked\r\n",
      "Transfer-Encoding: gzip, chunked\r\n",
      "Content-Encoding: gzip\r\n",
      "Expect: 100-continue\r\n",
      "Connection: keep-alive\r\n",
      "Content-Type: multipart/form-data; boundary=x\r\n",
      "Authorization: Bearer \r\n",
      "ffffffffffffffff\r\n",
      "0\r\n\r\n",
      "X: " + std::string(9000, 'a') + "\r\n",
      " HTTP/1.0",
      " HTTP/2",
      "GET /health",
      "POST /v1/completions",
      "/v1/chat/completions?x=%zz",
      "/../../etc/passwd",
      "%00",
      "\xff\xfe",
      ":",
      " ",
  };
  return d;
}

TEST(Fuzz, ServeRequests) {
  serve::ServeOptions o;
  o.model_name = "fuzz";
  o.log_requests = false;
  // One request at a time arrives here; 128 threads (the default) are more
  // than a busy test machine may start beside other test processes.
  o.threads = 8;
  test::ServedModel s(o);
  // The server's threads start before the campaign's guards cap the
  // address space (on the CUDA machine libtorch's mappings leave too
  // little under the cap to start a thread: "Resource temporarily
  // unavailable").
  const std::string ready =
      "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
  for (int i = 0; i < 100 && status_of(exchange(s.port, ready)) != 200; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_EQ(status_of(exchange(s.port, ready)), 200);
  const auto bodies = seed_bodies();
  std::vector<std::string> seeds;
  for (const auto& b : bodies)
    seeds.push_back(post("/v1/chat/completions", b));
  seeds.back() = post("/v1/completions", bodies.back());
  seeds.push_back(chunked("/v1/chat/completions", bodies[0]));
  seeds.push_back(
      "GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: "
      "close\r\n\r\n");
  // Kept alive: the answer ends by a quiet connection, not a close.
  seeds.push_back("GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
  Campaign c("serve-http");
  while (c.more(seeds.size())) {
    Rng rng = c.next_rng();
    const size_t k = c.tried() % seeds.size();
    std::string in = seeds[k];
    size_t piece = 0;
    int pause_ms = 0;
    if (c.tried() >= seeds.size()) {
      switch (rng.below(6)) {
        case 0:
        case 1: { // a mutated body behind a correct Content-Length
          const std::string& body = bodies[rng.below(bodies.size())];
          in = post(
              rng.chance(0.8) ? "/v1/chat/completions" : "/v1/completions",
              mutate_json(body, rng));
          break;
        }
        case 2: // a mutated body sent chunked
          in = chunked(
              "/v1/chat/completions",
              mutate_json(bodies[rng.below(bodies.size())], rng));
          break;
        case 3: { // the request line and headers spliced, body kept
          const size_t head = in.find("\r\n\r\n");
          in = mutate_with(in.substr(0, head), http_dictionary(), rng) +
              (head == std::string::npos ? "" : in.substr(head));
          break;
        }
        case 4: // raw bytes anywhere
          in = mutate_bytes(in, rng);
          break;
        default: // a slow client: a few bytes at a time
          piece = 1 + rng.below(64);
          pause_ms = 1 + int(rng.below(3));
          if (rng.chance(0.5))
            in = in.substr(0, rng.below(in.size() + 1)); // and it stops
          break;
      }
    }
    c.run(in, [&] {
      const std::string answer = exchange(s.port, in, piece, pause_ms);
      const int status = status_of(answer);
      if (status >= 500)
        throw std::runtime_error(
            "[fuzz] the server answered " + std::to_string(status) + ": " +
            printable(answer, 600));
      if (!answer.empty() && status == 0)
        throw std::runtime_error(
            "[fuzz] the answer is not HTTP: " + printable(answer, 300));
      // Whatever that was, the server still answers.
      const std::string health = exchange(
          s.port,
          "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: "
          "close\r\n\r\n");
      if (status_of(health) != 200)
        throw std::runtime_error(
            "[fuzz] /health stopped answering after this input: " +
            printable(health, 300));
    });
  }
}

} // namespace
} // namespace orchard::fuzz
