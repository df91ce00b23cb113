// How ZeRO-1 cuts a bucket of gradients into one region per rank
// (dist/gradient_averager.cpp, make_sharded): the regions all of one
// length, whole parameters (those whose update needs the whole tensor:
// Muon's matrices, SignSGD's rows, 8-bit moments' blocks) kept in one
// region, the others split where a region fills. Plain arithmetic over the
// parameters' sizes: no tensors, no collectives.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace orchard::dist::detail {

// Part of a parameter's flattened elements, [begin, begin + length), at
// `offset` in its bucket, stepped by rank `owner` (-1: not sharded).
struct Segment {
  int64_t begin, length, offset;
  int owner;
};

struct Regions {
  int64_t region = 0; // each rank's values; the bucket holds world x region
  std::vector<std::vector<Segment>> segments; // each parameter's, in order
};

// The regions of one bucket of `params` (each parameter's values and
// whether its update needs it whole, in bucket order), for owned.size()
// ranks: whole parameters first, largest first, each to the least filled
// region (of equal ones, the rank that owns least so far, so that ties do
// not all go to rank 0); the others poured in order into what is left,
// split where a region fills. `owned` (values each rank steps so far, over
// the buckets before) gains what each rank owns here. The region is a
// multiple of `align` values (the copy engines' shares start on 256-byte
// boundaries: 64).
Regions lay_out_regions(
    const std::vector<std::pair<int64_t, bool>>& params,
    std::vector<int64_t>& owned,
    int64_t align = 1);

} // namespace orchard::dist::detail
