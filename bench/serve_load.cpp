// Load on `orchard serve`: N clients at once, each sending streamed chat
// completions one after another over loopback. Prints requests/s, time to
// first token (median, p90) and generated tokens/s (all clients together,
// and per stream).
//
//   orchard_bench_serve PORT CLIENTS REQUESTS_PER_CLIENT MAX_TOKENS
#include <httplib.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {
double now_s() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}
double percentile(std::vector<double> v, double q) {
  if (v.empty())
    return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, size_t(q * double(v.size())))];
}
} // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(
        stderr,
        "usage: %s PORT CLIENTS REQUESTS_PER_CLIENT MAX_TOKENS\n",
        argv[0]);
    return 2;
  }
  const int port = std::atoi(argv[1]), clients = std::atoi(argv[2]),
            per = std::atoi(argv[3]), max_tokens = std::atoi(argv[4]);
  std::mutex mu;
  std::vector<double> ttft, stream_rate;
  std::atomic<long> tokens{0}, failures{0};
  const double t0 = now_s();
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c)
    threads.emplace_back([&, c] {
      httplib::Client client("127.0.0.1", port);
      client.set_read_timeout(600, 0);
      for (int i = 0; i < per; ++i) {
        nlohmann::json body = {
            {"messages",
             {{{"role", "user"},
               {"content",
                "What does 'orchard' mean? (" + std::to_string(c * per + i) +
                    ")"}}}},
            {"max_tokens", max_tokens},
            {"temperature", 1.0},
            {"seed", c * per + i},
            {"stream", true}};
        httplib::Request req;
        req.method = "POST";
        req.path = "/v1/chat/completions";
        req.set_header("Content-Type", "application/json");
        req.body = body.dump();
        const double start = now_s();
        double first = 0;
        long n = 0;
        std::string buffer;
        req.content_receiver =
            [&](const char* data, size_t len, uint64_t, uint64_t) {
              buffer.append(data, len);
              size_t at;
              while ((at = buffer.find("\n\n")) != std::string::npos) {
                std::string event = buffer.substr(0, at);
                buffer.erase(0, at + 2);
                if (event.find("\"content\"") != std::string::npos) {
                  if (n++ == 0)
                    first = now_s() - start;
                }
              }
              return true;
            };
        httplib::Response res;
        httplib::Error err;
        if (!client.send(req, res, err) || res.status != 200) {
          ++failures;
          continue;
        }
        const double total = now_s() - start;
        tokens += n;
        std::lock_guard<std::mutex> lock(mu);
        ttft.push_back(first);
        if (total > first && n > 1)
          stream_rate.push_back(double(n - 1) / (total - first));
      }
    });
  for (auto& t : threads)
    t.join();
  const double wall = now_s() - t0;
  const long done = long(ttft.size());
  std::printf(
      "{\"clients\": %d, \"requests\": %ld, \"failures\": %ld, "
      "\"wall_s\": %.2f, \"requests_per_s\": %.2f, "
      "\"ttft_median_ms\": %.1f, \"ttft_p90_ms\": %.1f, "
      "\"tokens_per_s_total\": %.1f, \"tokens_per_s_per_stream\": %.1f}\n",
      clients,
      done,
      failures.load(),
      wall,
      double(done) / wall,
      percentile(ttft, 0.5) * 1e3,
      percentile(ttft, 0.9) * 1e3,
      double(tokens.load()) / wall,
      percentile(stream_rate, 0.5));
  return failures.load() ? 1 : 0;
}
