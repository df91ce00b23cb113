#include "train/batch_schedule.h"

#include "core/error.h"
#include "core/strings.h"

#include <algorithm>
#include <limits>
#include <numeric>

namespace orchard::train {

namespace {

constexpr size_t kMaxStages = 64;

// "16384", "2*2048*8" or "2 * 2048 * 8": a positive integer.
int64_t parse_product(
    const std::string& item,
    const std::string& key,
    size_t index) {
  auto bad = [&](const std::string& why) -> UserError {
    return UserError(
        key + "[" + std::to_string(index) + "] = '" + item + "': " + why +
        "; write each entry as a whole number or a product such as "
        "2*2048*8.");
  };
  int64_t product = 1;
  size_t from = 0;
  const std::string text = trim(item);
  if (text.empty())
    throw bad("empty");
  for (;;) {
    const size_t star = text.find('*', from);
    const std::string factor = trim(text.substr(
        from, star == std::string::npos ? std::string::npos : star - from));
    if (factor.empty() ||
        !std::all_of(factor.begin(), factor.end(), [](char c) {
          return c >= '0' && c <= '9';
        }))
      throw bad("not a positive whole number");
    int64_t v = 0;
    for (char c : factor) {
      if (v > (std::numeric_limits<int64_t>::max() - 9) / 10)
        throw bad("too large");
      v = v * 10 + (c - '0');
    }
    if (v == 0)
      throw bad("zero");
    if (product > std::numeric_limits<int64_t>::max() / v)
      throw bad("too large");
    product *= v;
    if (star == std::string::npos)
      return product;
    from = star + 1;
  }
}

} // namespace

BatchSchedule BatchSchedule::parse(
    const std::vector<std::string>& tokens,
    const std::vector<std::string>& starts) {
  BatchSchedule s;
  if (tokens.empty()) {
    if (!starts.empty())
      throw UserError(
          "batch_schedule_steps is set without batch_schedule; give the "
          "tokens of each stage, e.g. batch_schedule=[16384,32768,49152].");
    return s;
  }
  if (tokens.size() > kMaxStages)
    throw UserError(
        "batch_schedule has " + std::to_string(tokens.size()) +
        " stages; at most " + std::to_string(kMaxStages) + ".");
  for (size_t i = 0; i < tokens.size(); ++i)
    s.tokens_.push_back(parse_product(tokens[i], "batch_schedule", i));
  if (!starts.empty() && starts.size() + 1 != tokens.size())
    throw UserError(
        "batch_schedule_steps has " + std::to_string(starts.size()) +
        " entries for " + std::to_string(tokens.size()) +
        " stages; give one fewer than the stages (where each later stage "
        "begins), or none to split training into equal parts.");
  for (size_t i = 0; i < starts.size(); ++i) {
    const int64_t v = parse_product(starts[i], "batch_schedule_steps", i);
    if (!s.starts_.empty() && v <= s.starts_.back())
      throw UserError(
          "batch_schedule_steps must increase: " + std::to_string(v) +
          " follows " + std::to_string(s.starts_.back()) + ".");
    s.starts_.push_back(v);
  }
  return s;
}

int64_t BatchSchedule::start_of(size_t k, int64_t total) const {
  if (k == 0)
    return 0;
  if (!starts_.empty())
    return std::min(starts_[k - 1], total);
  // Equal parts: stage k from ceil(k * total / K), as modded-nanogpt's
  // schedule takes stage floor(K * step / total).
  const int64_t K = static_cast<int64_t>(tokens_.size());
  return (static_cast<int64_t>(k) * total + K - 1) / K;
}

size_t BatchSchedule::stage_at(int64_t step, int64_t total) const {
  size_t k = 0;
  while (k + 1 < tokens_.size() && step >= start_of(k + 1, total))
    ++k;
  return k;
}

int64_t BatchSchedule::tokens_at(int64_t step, int64_t total) const {
  return tokens_[stage_at(step, total)];
}

int64_t BatchSchedule::unit() const {
  int64_t g = 0;
  for (int64_t t : tokens_)
    g = std::gcd(g, t);
  return g;
}

int64_t BatchSchedule::tokens_through(int64_t steps, int64_t total) const {
  int64_t sum = 0;
  for (size_t k = 0; k < tokens_.size(); ++k) {
    const int64_t from = start_of(k, total);
    const int64_t to = k + 1 < tokens_.size() ? start_of(k + 1, total) : total;
    const int64_t n = std::max<int64_t>(0, std::min(to, steps) - from);
    sum += n * tokens_[k];
  }
  return sum;
}

int64_t BatchSchedule::steps_for(int64_t tokens) const {
  const int64_t most = *std::max_element(tokens_.begin(), tokens_.end());
  int64_t n = std::max<int64_t>(1, (tokens + most - 1) / most);
  while (tokens_through(n, n) < tokens)
    ++n;
  return n;
}

std::string BatchSchedule::describe(int64_t total) const {
  std::string out;
  for (size_t k = 0; k < tokens_.size(); ++k) {
    const int64_t from = start_of(k, total);
    const int64_t to = k + 1 < tokens_.size() ? start_of(k + 1, total) : total;
    if (!out.empty())
      out += ", ";
    out += std::to_string(tokens_[k]) + (k == 0 ? " tokens a step" : "");
    if (to <= from)
      out += " (never reached)";
    else
      out += " for step" + std::string(to - from > 1 ? "s " : " ") +
          std::to_string(from + 1) +
          (to - from > 1 ? "-" + std::to_string(to) : "");
  }
  return out;
}

} // namespace orchard::train
