#include "dist/bucket_regions.h"

#include <algorithm>

namespace orchard::dist::detail {

Regions lay_out_regions(
    const std::vector<std::pair<int64_t, bool>>& params,
    std::vector<int64_t>& owned,
    int64_t align) {
  const int world = int(owned.size());
  std::vector<int64_t> filled(size_t(world), 0);
  std::vector<size_t> whole;
  int64_t total = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    total += params[i].first;
    if (params[i].second)
      whole.push_back(i);
  }
  std::stable_sort(whole.begin(), whole.end(), [&](size_t x, size_t y) {
    return params[x].first > params[y].first;
  });
  std::vector<std::pair<size_t, int>> whole_owner;
  for (size_t i : whole) {
    int r = 0;
    for (int k = 1; k < world; ++k)
      if (std::pair(filled[size_t(k)], owned[size_t(k)]) <
          std::pair(filled[size_t(r)], owned[size_t(r)]))
        r = k;
    whole_owner.push_back({i, r});
    filled[size_t(r)] += params[i].first;
  }
  Regions out;
  out.region = std::max(
      *std::max_element(filled.begin(), filled.end()),
      (total + world - 1) / world);
  out.region = (out.region + align - 1) / align * align;
  out.segments.resize(params.size());
  std::vector<int64_t> at(size_t(world), 0);
  for (const auto& [i, r] : whole_owner) {
    const int64_t n = params[i].first;
    out.segments[i].push_back({0, n, out.region * r + at[size_t(r)], r});
    at[size_t(r)] += n;
  }
  int r = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].second)
      continue;
    const int64_t n = params[i].first;
    for (int64_t begin = 0; begin < n;) {
      while (at[size_t(r)] == out.region)
        ++r;
      const int64_t take = std::min(n - begin, out.region - at[size_t(r)]);
      out.segments[i].push_back(
          {begin, take, out.region * r + at[size_t(r)], r});
      at[size_t(r)] += take;
      begin += take;
    }
  }
  for (int k = 0; k < world; ++k)
    owned[size_t(k)] += at[size_t(k)];
  return out;
}

} // namespace orchard::dist::detail
