#include "train/sharded_optimizer.h"

#include "core/error.h"

#include <sstream>
#include <unordered_map>

namespace orchard::train {
namespace {

const void* key_of(const torch::Tensor& t) {
  return t.unsafeGetTensorImpl();
}

// One optimizer tensor of a piece, as the other ranks learn of it.
struct Entry {
  std::string name; // "<parameter>.<state>"
  int dtype = 0;
  std::vector<int64_t> shape;
  int64_t begin = 0, length = 0; // the piece's elements
  bool whole = false;
  std::vector<int64_t> param_shape;
};

std::string join(const std::vector<int64_t>& v) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i)
    out += (i ? "," : "") + std::to_string(v[i]);
  return out;
}

std::vector<int64_t> split_ints(const std::string& s) {
  std::vector<int64_t> out;
  std::stringstream in(s);
  std::string part;
  while (std::getline(in, part, ','))
    if (!part.empty())
      out.push_back(std::stoll(part));
  return out;
}

std::string encode(const std::vector<Entry>& entries) {
  std::string out;
  for (const auto& e : entries)
    out += e.name + '\t' + std::to_string(e.dtype) + '\t' + join(e.shape) +
        '\t' + std::to_string(e.begin) + '\t' + std::to_string(e.length) +
        '\t' + (e.whole ? "1" : "0") + '\t' + join(e.param_shape) + '\n';
  return out;
}

std::vector<Entry> decode(const std::string& text) {
  std::vector<Entry> out;
  std::stringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    std::vector<std::string> f;
    std::stringstream fields(line);
    std::string field;
    while (std::getline(fields, field, '\t'))
      f.push_back(field);
    f.resize(7);
    out.push_back(
        {f[0],
         std::stoi(f[1]),
         split_ints(f[2]),
         std::stoll(f[3]),
         std::stoll(f[4]),
         f[5] == "1",
         split_ints(f[6])});
  }
  return out;
}

// The piece whose state `name` is ("<piece name>.<state>"; the longest
// piece name that fits).
const dist::ShardPiece* piece_of(
    const std::string& name,
    const std::vector<dist::ShardPiece>& pieces) {
  const dist::ShardPiece* best = nullptr;
  for (const auto& p : pieces)
    if (!p.name.empty() && name.size() > p.name.size() &&
        name.compare(0, p.name.size(), p.name) == 0 &&
        name[p.name.size()] == '.' &&
        (!best || p.name.size() > best->name.size()))
      best = &p;
  return best;
}

} // namespace

std::vector<dist::Shardable> shardables(
    const Optimizers& full,
    const std::vector<torch::Tensor>& trained) {
  std::unordered_map<const void*, std::pair<std::string, bool>> known;
  for (const auto& g : full.groups())
    for (const auto& [name, p] : g.params)
      known[key_of(p)] = {
          name,
          g.muon || g.rule == "sign_sgd" ||
              (g.rule.empty() && full.options().adam_8bit)};
  std::vector<dist::Shardable> out;
  for (const auto& t : trained) {
    auto it = known.find(key_of(t));
    if (it == known.end())
      out.push_back({"", t, true});
    else
      out.push_back({it->second.first, t, it->second.second});
  }
  return out;
}

std::unique_ptr<Optimizers> optimizers_of_pieces(
    const Optimizers& full,
    const std::vector<dist::ShardPiece>& pieces) {
  std::unordered_map<const void*, const dist::ShardPiece*> mine;
  for (const auto& p : pieces)
    mine[key_of(p.param)] = &p;
  std::vector<ParamGroup> groups = full.groups();
  for (auto& g : groups) {
    NamedTensors kept;
    for (const auto& [name, p] : g.params) {
      auto it = mine.find(key_of(p));
      if (it != mine.end())
        kept.push_back({name, it->second->value});
    }
    g.params = std::move(kept);
  }
  return std::make_unique<Optimizers>(std::move(groups), full.options());
}

NamedTensors gather_sharded_state(
    const NamedTensors& local,
    const std::vector<dist::ShardPiece>& pieces) {
  // What this rank sends: its pieces' state, but for pieces every rank
  // steps (rank 0 sends those).
  std::vector<Entry> mine;
  std::vector<torch::Tensor> sent;
  for (const auto& [name, t] : local) {
    const dist::ShardPiece* p = piece_of(name, pieces);
    if (!p)
      throw std::logic_error("[zero] optimizer state '" + name +
                             "' of no piece of this rank");
    if (p->everywhere && !dist::leader())
      continue;
    sent.push_back(t);
    mine.push_back(
        {name,
         int(t.scalar_type()),
         t.sizes().vec(),
         p->begin,
         p->length,
         p->whole,
         p->param.sizes().vec()});
  }
  const auto listed = dist::gather_strings(encode(mine));
  // Rank 0 has its own; every other rank's tensors reach it by broadcast,
  // one at a time, in the order the lists give.
  std::vector<std::pair<Entry, torch::Tensor>> parts;
  for (size_t i = 0; i < sent.size() && dist::leader(); ++i)
    parts.push_back({mine[i], sent[i]});
  for (int r = 1; r < dist::size(); ++r) {
    const auto entries = decode(listed[size_t(r)]);
    for (size_t i = 0; i < entries.size(); ++i) {
      const Entry& e = entries[i];
      torch::Tensor t = r == dist::rank()
          ? sent[i]
          : torch::empty(
                e.shape,
                torch::TensorOptions().dtype(c10::ScalarType(e.dtype)));
      dist::broadcast_from(r, t);
      if (dist::leader())
        parts.push_back({e, t});
    }
  }
  if (!dist::leader())
    return {};
  // Put together: whole pieces and scalars (a step count) as they are;
  // the element ranges of one tensor into its shape.
  NamedTensors out;
  std::unordered_map<std::string, size_t> at;
  std::unordered_map<std::string, int64_t> covered;
  for (const auto& [e, t] : parts) {
    const bool as_is = e.whole || t.dim() == 0;
    auto it = at.find(e.name);
    if (it == at.end()) {
      at[e.name] = out.size();
      if (as_is) {
        out.push_back({e.name, t});
        continue;
      }
      out.push_back(
          {e.name,
           torch::zeros(e.param_shape, t.options().device(t.device()))});
      it = at.find(e.name);
    } else if (as_is) {
      continue; // a step count every piece of the tensor carries
    }
    out[it->second]
        .second.view({-1})
        .narrow(0, e.begin, e.length)
        .copy_(t.reshape({-1}).to(out[it->second].second.device()));
    covered[e.name] += e.length;
  }
  for (const auto& [name, n] : covered) {
    const int64_t want = out[at[name]].second.numel();
    if (n != want)
      throw std::logic_error(
          "[zero] optimizer state '" + name + "': pieces cover " +
          std::to_string(n) + " of " + std::to_string(want) + " values");
  }
  return out;
}

std::map<std::string, torch::Tensor> slice_sharded_state(
    const std::map<std::string, torch::Tensor>& saved,
    const std::vector<dist::ShardPiece>& pieces) {
  std::map<std::string, torch::Tensor> out = saved;
  for (const auto& p : pieces) {
    if (p.whole || p.name.empty())
      continue;
    const std::string prefix = p.name + ".";
    for (auto it = saved.lower_bound(prefix);
         it != saved.end() && it->first.compare(0, prefix.size(), prefix) == 0;
         ++it)
      if (it->second.dim() > 0 && it->second.numel() == p.param.numel() &&
          piece_of(it->first, pieces) == &p)
        out[it->first] =
            it->second.reshape({-1}).narrow(0, p.begin, p.length).clone();
  }
  return out;
}

} // namespace orchard::train
