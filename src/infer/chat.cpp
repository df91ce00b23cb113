#include "infer/chat.h"

#include "core/error.h"
#include "data/chat_file.h"
#include "text/tokenizer_io.h"

#include <algorithm>
#include <set>

namespace orchard::infer {

namespace {
// Bytes a UTF-8 character has, from its first byte (1 for stray bytes).
size_t utf8_length(unsigned char c) {
  if (c >= 0xF0 && c <= 0xF4)
    return 4;
  if (c >= 0xE0)
    return c <= 0xEF ? 3 : 1;
  if (c >= 0xC2)
    return 2;
  return 1;
}
} // namespace

std::string Utf8Stream::push(const std::string& bytes) {
  // A model can produce any byte sequence; what is not UTF-8 becomes
  // U+FFFD (as Python's errors="replace"), so the text is always valid.
  static const std::string kReplacement = "\xEF\xBF\xBD";
  pending_ += bytes;
  std::string out;
  size_t i = 0;
  while (i < pending_.size()) {
    const unsigned char c = (unsigned char)pending_[i];
    size_t n = c < 0x80 ? 1 : utf8_length(c);
    if (c >= 0x80 && n == 1) { // a stray continuation or invalid lead byte
      out += kReplacement;
      ++i;
      continue;
    }
    size_t k = 1;
    while (k < n && i + k < pending_.size() &&
           ((unsigned char)pending_[i + k] & 0xC0) == 0x80)
      ++k;
    if (k == n) {
      out.append(pending_, i, n);
      i += n;
    } else if (i + k == pending_.size()) {
      break; // incomplete so far: wait for more
    } else {
      out += kReplacement; // cut short by a byte that does not continue it
      i += k;
    }
  }
  pending_.erase(0, i);
  if (drop_first_space_ && !out.empty()) {
    if (out[0] == ' ')
      out.erase(0, 1);
    drop_first_space_ = false;
  }
  return out;
}

std::string Utf8Stream::flush() {
  const bool any = !pending_.empty();
  pending_.clear();
  return any ? "\xEF\xBF\xBD" : ""; // an unfinished character
}

ChatModel::ChatModel(runs::LoadedModel model, torch::Device device)
    : loaded_(std::move(model)),
      tok_(loaded_.tokenizer),
      tmpl_(std::make_unique<text::ChatTemplate>(runs::chat_template(loaded_))),
      engine_(loaded_.model, device) {
  for (auto id : tmpl_->stop_tokens())
    stop_.push_back(int64_t(id));
}

std::vector<int64_t> ChatModel::prompt_ids(
    const std::vector<text::Message>& messages) const {
  std::vector<int64_t> ids;
  for (auto id : tmpl_->generation_prompt(messages))
    ids.push_back(int64_t(id));
  return ids;
}

std::string ChatModel::text_of(const std::vector<int64_t>& ids) const {
  std::string out, piece;
  std::set<int64_t> special;
  for (const auto& [t, id] : tok_->special_tokens())
    special.insert(int64_t(id));
  for (auto id : ids)
    if (!special.count(id) && tok_->token_bytes(text::TokenId(id), piece))
      out += piece;
  return out;
}

std::string ChatModel::reply(
    const std::vector<text::Message>& messages,
    const SamplingOptions& options,
    const std::function<bool(const std::string&)>& on_text,
    GenerationStats* stats) {
  std::vector<int64_t> prompt = prompt_ids(messages);
  if (int64_t(prompt.size()) >= max_seq_len())
    throw UserError(
        "the conversation is " + std::to_string(prompt.size()) +
        " tokens; this model reads at most " + std::to_string(max_seq_len()) +
        ". Start a new chat (/clear) or send less text.");
  SamplingOptions opt = options;
  opt.stop_tokens.insert(opt.stop_tokens.end(), stop_.begin(), stop_.end());
  Utf8Stream utf8(tok_->sentencepiece());
  std::string reply, piece;
  bool go_on = true;
  engine_.generate(
      prompt,
      opt,
      [&](int64_t id) {
        if (std::find(stop_.begin(), stop_.end(), id) != stop_.end())
          return false;
        piece = text_of({id});
        std::string text = utf8.push(piece);
        reply += text;
        if (!text.empty() && on_text)
          go_on = on_text(text);
        return go_on;
      },
      true,
      stats);
  std::string rest = utf8.flush();
  if (!rest.empty()) {
    reply += rest;
    if (on_text && go_on)
      on_text(rest);
  }
  return reply;
}

std::vector<ChatSample> sample_chat_answers(
    const runs::LoadedModel& model,
    const std::string& chat_path,
    int count,
    const SamplingOptions& options) {
  ChatModel chat(model, model.model->device());
  data::ChatFile file = data::ChatFile::open(chat_path);
  std::vector<ChatSample> out;
  const size_t n = file.size();
  for (int k = 0; k < count && size_t(k) < n; ++k) {
    const size_t i = size_t(k) * n / size_t(count);
    const uint32_t* ids = file.ids(i);
    const uint8_t* mask = file.mask(i);
    const size_t len = file.length(i);
    size_t a = 0;
    while (a < len && !mask[a])
      ++a;
    size_t b = a;
    while (b < len && mask[b])
      ++b;
    if (a == len || b - a < 2)
      continue;
    std::vector<int64_t> prompt(ids, ids + a),
        reference(ids + a, ids + b - 1); // without the end-of-turn token
    SamplingOptions opt = options;
    opt.stop_tokens.push_back(int64_t(ids[b - 1]));
    opt.stop_tokens.insert(
        opt.stop_tokens.end(),
        chat.stop_tokens().begin(),
        chat.stop_tokens().end());
    auto answer = chat.engine().generate(prompt, opt);
    std::vector<int64_t> kept;
    for (auto id : answer)
      if (std::find(opt.stop_tokens.begin(), opt.stop_tokens.end(), id) ==
          opt.stop_tokens.end())
        kept.push_back(id);
    // The question: the prompt's text without the template's tokens.
    out.push_back(
        {chat.text_of(prompt), chat.text_of(kept), chat.text_of(reference)});
  }
  return out;
}

} // namespace orchard::infer
