// ZeRO-1 on the Trainer's side (zero_stage=1 with several processes): the
// optimizer of this rank's pieces of the parameters (dist::GradientAverager
// ::make_sharded lays them out), and its state converted to and from the
// checkpoint's, which is the unsharded optimizer's (the same names and
// shapes). A run therefore resumes with any number of processes, sharded
// or not: each rank takes its pieces' slices of the saved state.
#pragma once

#include "dist/world.h"
#include "train/optimizer.h"

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace orchard::train {

// The trained parameters, named as `full` names them, marked whole where
// the group's update needs the whole tensor (Muon, SignSGD, 8-bit
// moments). A parameter no group steps is whole and nameless.
std::vector<dist::Shardable> shardables(
    const Optimizers& full,
    const std::vector<torch::Tensor>& trained);

// `full`'s groups, rules and options over `pieces` (a group may be empty).
std::unique_ptr<Optimizers> optimizers_of_pieces(
    const Optimizers& full,
    const std::vector<dist::ShardPiece>& pieces);

// Collective: every rank's `local` state (of its pieces) put together into
// the unsharded optimizer's state, complete on rank 0 (empty elsewhere).
NamedTensors gather_sharded_state(
    const NamedTensors& local,
    const std::vector<dist::ShardPiece>& pieces);

// The part of the unsharded `saved` state that belongs to `pieces`.
std::map<std::string, torch::Tensor> slice_sharded_state(
    const std::map<std::string, torch::Tensor>& saved,
    const std::vector<dist::ShardPiece>& pieces);

} // namespace orchard::train
