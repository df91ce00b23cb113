// Inside src/dist only (gradient_averager.cpp, sharded_gather.cpp): the
// GradientAverager (world.h) with several processes. Included after
// core/torch_compat.h's c10d section (ORCHARD_C10D_COMPAT, no precompiled
// header), as those files are built.
#pragma once

#include "core/torch_compat.h"

#include "dist/world.h"

#include "core/gradient_sink.h"
#include "dist/bucket_regions.h"
#include "dist/c10d_group.h"
#include "dist/copy_engine_mean.h"

#if defined(USE_C10D_NCCL)
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#if defined(ORCHARD_HAVE_C10D)
namespace orchard::dist::detail {

// Buckets of up to bucket_bytes (100 MB unless set; DDP's 25 MB was slower
// on two H200s, bench/RESULTS.md), parameters in
// the reverse of their order: the backward produces the last layers'
// gradients first. Sharded, each rank's region of a bucket is up to
// bucket_bytes, or twice the largest whole parameter where that is more
// (a bucket of world x that), so that a bucket holds several whole
// parameters to balance between the regions: a whole parameter alone in
// its bucket would leave the other regions as padding, sent for nothing
// (a d20's 26 MB MLP matrices with Muon, an 8-bit embedding).
// Also the products' gradient sink (core/gradient_sink.h) while the last
// backward of a step runs: a weight whose gradient lands whole in one
// place of a bucket gets that place to be written by its product, so the
// hook has nothing to copy (as DDP's gradient_as_bucket_view).
class OverlappedAverager final : public GradientAverager, public GradientSink {
 public:
  OverlappedAverager(
      const std::vector<Shardable>& params,
      bool sharded,
      const AveragingOptions& options);

  ~OverlappedAverager() override;
  void arm() override;
  void disarm() override;
  void finish() override;

  const std::vector<ShardPiece>& pieces() const override {
    return pieces_;
  }

  void gather_parameters(bool exact) override;

  torch::Tensor share_squares() const override {
    return copies_ && squares_whole_ ? copies_->share_squares()
                                     : torch::Tensor();
  }

  bool in_share_squares(const torch::Tensor& param) const override;
  std::string describe() const override;

 private:
  using Segment = detail::Segment;
  struct Slot {
    std::string name;
    torch::Tensor param;
    bool whole;
    size_t bucket;
    std::vector<Segment> segments;
    bool ready;
    bool given; // its place in the bucket handed to its product
    // Made from every rank's gathered rows (gathered_gradient): the mean
    // already, not copied into its bucket.
    bool gathered;
    bool everywhere; // sharded, yet stepped whole by every rank
    // What earlier micro-steps of the step accumulated in .grad, moved
    // out by arm(): the last backward's gradient is then made in the
    // bucket (or copied there) with this added, and autograd keeps it as
    // .grad without adding it up a second time (finish() replaces .grad
    // by the mean anyway). Released by finish() and disarm().
    torch::Tensor earlier;
  };
  struct Bucket {
    torch::TensorOptions options;
    bool gathers_low = false;   // sharded: parameters gathered in gather_dtype_
    bool everywhere = false;    // sharded: not cut into regions (Shardable's)
    std::vector<size_t> pieces; // sharded: this rank's (pieces_), in order
    int64_t values = 0;         // sharded: world x region
    int64_t region = 0;         // sharded: each rank's values
    std::vector<size_t> slots;
    size_t ready = 0;
    torch::Tensor flat;
    // NCCL, reduce_dtype_ not float32: flat in reduce_dtype_, what is sent.
    torch::Tensor low;
    c10::intrusive_ptr<c10d::Work> work;
  };

#if defined(USE_C10D_NCCL)
  // The side streams of a bucket sent in reduce_dtype_: `to` casts it
  // down once the backward's stream has made it (and NCCL sends from
  // there), `back` casts the mean up once NCCL is done, while the
  // backward goes on.
  struct Casts {
    c10::cuda::CUDAStream to, back;
    at::cuda::CUDAEvent made, back_done;
  };
  std::optional<Casts> casts_;
#endif
  bool casts_present() const;
  static std::string format_megabytes(int64_t bytes);
  static std::string format_share(double x);

  torch::Tensor region(const Bucket& b, int r) const {
    return b.flat.narrow(0, b.region * r, b.region);
  }
  torch::Tensor in_bucket(const Slot& s, const Segment& g) {
    return buckets_[s.bucket].flat.narrow(0, g.offset, g.length);
  }
  torch::Tensor piece_in_bucket(size_t k) {
    const auto [bucket, offset] = piece_at_[k];
    return buckets_[bucket].flat.narrow(0, offset, pieces_[k].length);
  }

  // Whether bucket b's updated values are all-gathered in gather_dtype_
  // (on the copy engines, unless `exact`).
  bool sends_low(const Bucket& b, bool exact) const {
    return copies_ && b.gathers_low && !exact;
  }

  // A low bucket's values as gather_dtype_ (twice as many): rank r's
  // region's first half holds its values sent low, a value at offset o of
  // the float32 bucket at o + region x r of these.
  torch::Tensor low_values(const Bucket& b) const {
    return b.flat.view(gather_dtype_);
  }

  // This rank's updated pieces of bucket bi written into its region, in
  // gather_dtype_ where `low`.
  void pack(size_t bi, bool low);
  // The other ranks' pieces of bucket bi, gathered into their regions,
  // copied out into the parameters.
  void unpack(size_t bi, bool low);
  // pack's (`in`) or unpack's copies of bucket bi, as (from, to) pairs, run
  // as copy_pieces_ prepared them the first time (one kernel on CUDA).
  void copy_pieces(size_t bi, bool in, bool low);
  std::vector<std::pair<torch::Tensor, torch::Tensor>> pieces_in(
      size_t bi,
      bool low);
  std::vector<std::pair<torch::Tensor, torch::Tensor>> pieces_out(
      size_t bi,
      bool low);

  // gather_parameters on the copy engines, a bucket at a time: bucket b's
  // regions are pulled from their owners while this rank packs the next
  // bucket, and copied out into the parameters while the next is pulled.
  void gather_on_copy_engines(bool exact);

  // The sink (core/gradient_sink.h), on autograd's thread: the weight's
  // place in its bucket, once a backward, where the gradient lands whole
  // in one place (on_gradient adds what earlier micro-steps accumulated).
  torch::Tensor destination(std::intptr_t key) override;

  // The sink's gathered embedding gradient (core/gradient_sink.h), on
  // autograd's thread: where every rank's rows (n each, the same n on
  // every rank: same_rows_) are fewer values than a ring all-reduce sends
  // of the weight's gradient (n x world < 2 x num_rows), nothing from
  // earlier micro-steps is to be added, and `sum` makes the same bits on
  // every rank. Every rank decides alike from the shapes and the build,
  // so all issue the same collectives.
  torch::Tensor gathered_gradient(
      std::intptr_t key,
      const torch::Tensor& rows,
      const torch::Tensor& ids,
      int64_t num_rows,
      RowsSum& sum) override;

  // The copy engines (copy_engine_mean.h), where mover_ asks for them
  // and they can average these buckets; else NCCL or Gloo.
  void start_copy_engines(const AveragingOptions::MeanOf& mean_of);

  void leave_sink() {
    if (gradient_sink() == this)
      set_gradient_sink(nullptr);
  }

  // Autograd's hook (its thread on CUDA): the step's gradient g of
  // parameter i, before it is added to .grad. The bucket gets the sum now
  // (queued on the stream the collective waits for), unless its product
  // made g in the bucket already.
  void on_gradient(size_t i, const torch::Tensor& g);

  void ready(size_t i) {
    slots_[i].ready = true;
    ++buckets_[slots_[i].bucket].ready;
  }

  // Sends the full buckets, in bucket order (every rank must issue the
  // same collectives in the same order).
  void launch_ready(bool in_backward);

  // NCCL's mean of bucket b's values in `all` (b.flat, or b.low), in
  // place: all-reduced, or reduce-scattered into this rank's region. NCCL
  // averages as it sums (ReduceOp::AVG): no division pass over the
  // gradients after the backward.
  c10::intrusive_ptr<c10d::Work> average_on_nccl(
      const Bucket& b,
      torch::Tensor& all);

#if defined(USE_C10D_NCCL)
  // Bucket b cast to reduce_dtype_, averaged (all-reduced, or
  // reduce-scattered into this rank's region) and cast back, all on side
  // streams: the backward's stream only marks where b is made, and
  // finish() waits for the last cast back.
  void send_low(Bucket& b);
#endif

  bool sharded_;
  std::unique_ptr<detail::CopyEngineMean> copies_;
  std::string copies_unavailable_; // why not, on CUDA where not ruled out
  // Every rank's micro-steps have the same shapes (a GPT's B x T windows),
  // so an embedding's rows can be gathered.
  bool same_rows_;
  // The dtype gradients are averaged in; rounds_: some bucket's gradients
  // are float32 and reduce_dtype_ is not.
  torch::ScalarType reduce_dtype_;
  AveragingOptions::Mover mover_;
  torch::ScalarType gather_dtype_;
  AveragingOptions::CopyPieces copy_pieces_;
  // copy_pieces' prepared copies: (bucket, in, low) -> what runs them.
  std::map<std::tuple<size_t, bool, bool>, std::function<void()>> prepared_;
  bool rounds_ = false;
  bool sent_low_ = false; // this step (send_low)
  size_t gathered_ = 0;
  int64_t gathered_bytes_ = 0, gathered_weight_bytes_ = 0;
  std::string skip_;       // ORCHARD_TEST_SKIP_BUCKETS
  int64_t region_cap_ = 0; // bytes of a rank's region (sharded)
  std::vector<Slot> slots_;
  std::unordered_map<std::intptr_t, size_t> slot_of_key_;
  // This step's buckets all averaged by the copy engines, none holding a
  // gathered gradient: their squares (share_squares) count every bucketed
  // gradient.
  bool squares_whole_ = false;
  std::vector<Bucket> buckets_;
  std::vector<ShardPiece> pieces_;
  // Each piece's bucket and offset in it, and its parameter's slot.
  std::vector<std::pair<size_t, int64_t>> piece_at_;
  std::vector<size_t> piece_slot_;
  // 1 where this rank gave the parameter a gradient, then the sum over the
  // ranks; and how many no rank gave one in the last step.
  torch::Tensor used_;
  size_t unused_ = 0;
  std::vector<unsigned> hooks_;
  std::mutex mu_;
  bool armed_ = false;
  size_t next_ = 0;
  size_t sent_in_backward_ = 0, hooked_ = 0, in_place_ = 0;
};

} // namespace orchard::dist::detail
#endif
