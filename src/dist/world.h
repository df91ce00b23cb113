// The process group of a multi-process run, on PyTorch's c10d: a TCPStore
// rendezvous (rank 0 serves it, or torchrun's agent does), then Gloo on the
// CPU or NCCL on CUDA. One per process; every function here is a no-op (or
// the identity) in a single-process run, so the training code calls them
// unconditionally.
//
// Builds without c10d (a libtorch without Gloo headers and without NCCL)
// compile this file too: init() then refuses a multi-process run with a
// clear message.
#pragma once

#include "dist/launch_env.h"

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace orchard::dist {

// Joins the process group `env` describes, with the collective backend for
// `device` (NCCL for CUDA, Gloo for the CPU). UserError when the rendezvous
// fails (port in use, rank 0 unreachable within the timeout) or no backend
// serves that device in this build. Ranks other than 0 print nothing to
// stdout from here on (their errors still reach stderr).
void init(const LaunchEnv& env, const torch::Device& device);
// Whether this build can run several processes on `device_type`
// ("cpu", "cuda"), and the backend's name ("Gloo", "NCCL") or why not.
std::pair<bool, std::string> backend_for(const std::string& device_type);

// The end of the process: with several processes, takes the group down
// while the devices are still up (after a failure, leaves at once instead,
// so that no collective waits on a rank that stopped). Returns exit_code.
int finish(int exit_code);

bool active(); // joined a group of more than one process
int rank();    // 0 in a single process
int size();    // 1 in a single process
// Rank 0: the process that writes logs, metrics, checkpoints and reports.
inline bool leader() {
  return rank() == 0;
}
const LaunchEnv& launch();

// The mean over the ranks of each tensor, in place (flattened into buckets
// of one dtype, all-reduced, divided by the world size).
void all_reduce_mean(const std::vector<torch::Tensor>& tensors);
// The mean over the ranks of the gradients of `params`, all-reduced in
// buckets while the backward that produces them still runs (what DDP's
// reducer does): arm() before a step's last backward; a hook copies each
// gradient into its flat bucket as autograd hands it over (plus what
// earlier micro-steps accumulated in .grad), and a bucket whose gradients
// are all in is sent at once, buckets in the same order on every rank.
// finish() sends what the backward left (parameters it did not reach),
// waits, divides, and makes every .grad a view of its mean (no copy back).
// A single process needs none of this: make() returns null there.
//
// ZeRO-1 (make_sharded; DeepSpeed's stage 1, nanochat's distributed
// AdamW and Muon): each rank keeps the optimizer state of its own share of
// the parameters only. A bucket is cut into one region per rank, all of
// one length (zeros pad the shorter ones); a region holds whole parameters
// where the update needs the whole tensor (Muon's orthogonalisation,
// SignSGD's rows, 8-bit moments' blocks) and element ranges of the others
// (AdamW is elementwise). The gradients are reduce-scattered rather than
// all-reduced: after finish() each rank holds the mean gradient of its own
// pieces (as their .grad) and the parameters' own .grad is dropped. The
// owners step their pieces, then gather_parameters() all-gathers the
// regions back into every rank's parameters. Traffic is an all-reduce's
// (a reduce-scatter and an all-gather); the optimizer's state and work
// are divided by the world size. On one CUDA host the GPUs' copy engines
// move both (AveragingOptions::mover), and the all-gather sends the
// parameters marked `low` in AveragingOptions::gather_dtype: a rank then
// holds the others' pieces of them rounded to it, which changes nothing
// where they are read only by products in that dtype (autocast rounds
// them so anyway); each owner keeps its float32 values, and
// gather_parameters(/*exact=*/true) sends them all in float32 (before a
// checkpoint).
struct Shardable {
  std::string name;
  torch::Tensor param;
  bool whole = false; // its update needs the whole tensor
  bool low = false;   // read only by products in the compute dtype
  // Its gradient may be made from every rank's gathered rows (an
  // embedding; AveragingOptions::same_rows_on_every_rank): not sharded,
  // every rank holds its mean and steps it whole, as without ZeRO-1.
  bool everywhere = false;
};
struct ShardPiece {
  std::string name;
  torch::Tensor param;           // the whole parameter
  int64_t begin = 0, length = 0; // its flattened elements this rank owns
  bool whole = false;            // all of them, as one unit
  // What the optimizer steps: the parameter itself when whole, else a flat
  // view of the owned elements. Its .grad is the mean gradient from
  // finish() to gather_parameters().
  torch::Tensor value;
  bool everywhere = false; // stepped whole by every rank (Shardable's)
};

// How a GradientAverager sends.
struct AveragingOptions {
  // Every rank's micro-steps have the same shapes (a GPT's B x T
  // windows), so that an embedding's gradient can be made from every
  // rank's rows of its output's gradient, gathered, where they are fewer
  // values than the weight (core/gradient_sink.h).
  bool same_rows_on_every_rank = false;
  // What the gradients are averaged in. bfloat16 (for float32 gradients)
  // sends half the bytes, as DDP's bf16_compress_hook: on NCCL each
  // bucket is cast to bfloat16 on a side stream, averaged in bfloat16 and
  // cast back while the backward goes on; on Gloo each rank's gradient is
  // rounded to bfloat16 and the sum sent in float32 (the same rounding,
  // none of the saving: the CPU's sends are not what limits it).
  torch::ScalarType reduce_dtype = torch::kFloat32;
  // A bucket's cap (DDP's bucket_cap_mb); sharded, a rank's region's.
  int64_t bucket_bytes = int64_t(100) << 20;
  // What moves a bucket's bytes on CUDA (the grad_average setting):
  // `automatic`, the GPUs' copy engines where they can (every rank on this
  // host, float32 buckets averaged in float32, not bfloat16; sharded,
  // reduce-scattered and all-gathered), else NCCL; `nccl`, NCCL's kernels
  // always; `copy_engines`, the copy engines or a UserError saying why not. The
  // copy engines hold no SMs while they send (dist/copy_engine_mean.h).
  enum class Mover { automatic, nccl, copy_engines };
  Mover mover = Mover::automatic;
  // Where the copy engines average: out = the mean of parts (a bucket's
  // share from every rank, summed in rank order, then times 1 / ranks),
  // and into *squares (where given) the sum of the squares of out's values
  // (a float32 tensor of one value). train passes ops::mean_of (one CUDA
  // pass; dist does not include ops); unset, the copy engines are not
  // used.
  using MeanOf = std::function<void(
      torch::Tensor& out,
      const std::vector<torch::Tensor>& parts,
      torch::Tensor* squares)>;
  MeanOf mean_of;
  // ZeRO-1 on the copy engines: the dtype the `low` parameters are
  // all-gathered in (bfloat16 or float16 under autocast; float32 sends
  // them as they are).
  torch::ScalarType gather_dtype = torch::kFloat32;
  // ZeRO-1's copies between the parameters and the buckets (each rank's
  // updated pieces in, the others' out), a bucket at a time: given the
  // (from, to) pairs, what copies them, prepared once and run every step.
  // train passes ops::prepare_copies (one CUDA kernel for all the pieces);
  // unset, a copy_ a pair.
  using CopyPieces = std::function<std::function<void()>(
      std::vector<std::pair<torch::Tensor, torch::Tensor>>)>;
  CopyPieces copy_pieces;
};
// The Mover a grad_average setting names ("auto", "nccl", "copy_engines").
AveragingOptions::Mover mover_named(const std::string& name);

class GradientAverager {
 public:
  static std::unique_ptr<GradientAverager> make(
      const std::vector<torch::Tensor>& params,
      const AveragingOptions& options = {});
  // ZeRO-1 (above); null in a single process.
  static std::unique_ptr<GradientAverager> make_sharded(
      const std::vector<Shardable>& params,
      const AveragingOptions& options = {});
  // Sharded only: this rank's pieces (in bucket order), and the
  // all-gather of every rank's updated pieces into the parameters (in
  // float32 where `exact`, else the `low` ones in gather_dtype).
  virtual const std::vector<ShardPiece>& pieces() const = 0;
  virtual void gather_parameters(bool exact) = 0;
  virtual ~GradientAverager() = default;
  virtual void arm() = 0;
  virtual void finish() = 0;
  // Drops an armed step's sends and its gradients (an error mid-backward;
  // with several processes the run then stops).
  virtual void disarm() = 0;
  // What the last step did: how many buckets, and how many of them were
  // sent while the backward still ran.
  virtual std::string describe() const = 0;
  // After finish(), where the copy engines averaged every bucket that had
  // anything to average: the sum of the squares of the mean gradients in
  // this rank's shares of the buckets, made as they were averaged (a
  // float32 tensor of one value; the sum over the ranks is that of every
  // bucketed gradient). Undefined otherwise: the caller then reads the
  // gradients for their norm.
  virtual torch::Tensor share_squares() const {
    return {};
  }
  // Whether share_squares() counts `param`'s gradient (a parameter whose
  // mean sits in a bucket, not one gathered whole).
  virtual bool in_share_squares(const torch::Tensor& param) const {
    (void)param;
    return false;
  }
};

// The sum over the ranks, in place.
void all_reduce_sum(const torch::Tensor& tensor);
// Every rank's `rows` stacked along dimension 0 in rank order, on every
// rank (each rank's tensor of the same shape and dtype; not bool). `rows`
// itself in a single process.
torch::Tensor gather_rows(const torch::Tensor& rows);
// gather_rows begun now and done by wait(): with NCCL the gather runs
// while the caller goes on, and wait() makes the current stream wait for
// it; elsewhere it is done before start_gather_rows returns. `what` names
// the collective in messages.
struct RowsGathering {
  torch::Tensor all;
  std::function<void()> done; // empty: `all` is ready
  torch::Tensor wait() {
    if (done)
      std::exchange(done, nullptr)();
    return all;
  }
};
RowsGathering start_gather_rows(
    const torch::Tensor& rows,
    const std::string& what);
// The smallest of every rank's `value` (device_batch_size=auto: all ranks
// take the same micro-batch).
int64_t min_over_ranks(int64_t value);
// Rank 0's values into every rank's tensors, in place.
void broadcast_from_leader(const std::vector<torch::Tensor>& tensors);
// Rank `root`'s tensor into every rank's (same shape and dtype), in place.
void broadcast_from(int root, const torch::Tensor& tensor);
// Every rank's `text`, in rank order, on every rank.
std::vector<std::string> gather_strings(const std::string& text);
// Waits for every rank; `what` names the point in messages.
void barrier(const std::string& what);
// Runs `fn` on rank 0, then (after a barrier) on the others: preparing a
// cache every rank then reads.
void leader_first(const std::string& what, const std::function<void()>& fn);

} // namespace orchard::dist
