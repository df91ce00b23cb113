// The Tiny Recursive Model (Jolicoeur-Martineau, "Less is More: Recursive
// Reasoning with Tiny Networks", 2025; upstream SamsungSAILMontreal/
// TinyRecursiveModels at e7b6871): one small network applied over and over
// to two latent states, supervised at every step of an outer loop that
// learns when to stop.
//
// Dimension letters: B puzzles, S answer cells (seq_len), P puzzle
// embedding positions (puzzle_emb_len) prepended to them, T = P + S, D
// hidden_size, V vocab.
//
// One supervision step, from the carry (z_H, z_L), each (B, T, D):
//   x = sqrt(D) * [puzzle_emb(id) ; embed_tokens(input)] (+ positions)
//   H_cycles times:  L_cycles times  z_L = net(z_L + z_H + x)
//                                    z_H = net(z_H + z_L)
//   all cycles but the last without gradients; the carry leaves detached.
//   logits = lm_head(z_H)[P:], (q_halt, q_continue) = q_head(z_H[0])
// net is L_layers post-norm blocks: h = norm(h + mix(h)); h = norm(h +
// SwiGLU(h)), where mix is attention (rotary, learned or no positions) or,
// with mlp_t, a SwiGLU across the T positions (the Sudoku variant; its
// norm then runs over positions, as upstream's does). RMSNorm has no
// scale (eps 1e-5); no linear has a bias but the Q-head's (-5: halting
// starts unlikely). Initial states H_init and L_init are fixed std-1
// vectors; weights are truncated LeCun-normal.
//
// Halting (ACT) is decided outside the network (halt_decision): training
// halts at halt_max_steps or when q_halt > 0 (q_halt > q_continue without
// no_ACT_continue), with exploration; evaluation always runs
// halt_max_steps. The model knows nothing of datasets or losses.
//
// With causal = true (for next-token training) attention is causal; the
// recursion and the input injection are position-wise, so position t
// still never sees t + 1. mlp_t mixes every position into every other and
// is refused with causal.
#pragma once

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace orchard::models {

struct TrmConfig {
  int64_t seq_len = 81;    // S: answer cells (9x9 Sudoku: 81)
  int64_t vocab_size = 11; // V: Sudoku's pad, blank and 9 digits
  int64_t num_puzzle_identifiers = 1;
  int64_t puzzle_emb_ndim = 512; // width of a puzzle's embedding (0: none)
  int64_t puzzle_emb_len = 16;   // P (0: ceil(puzzle_emb_ndim / D))
  int64_t H_cycles = 3;
  int64_t L_cycles = 6;
  int64_t L_layers = 2;
  int64_t hidden_size = 512; // D
  int64_t num_heads = 8;
  double expansion = 4;               // SwiGLU width factor
  std::string pos_encodings = "rope"; // rope | learned | none
  bool mlp_t = false;                 // token-mixing MLP instead of attention
  bool causal = false;                // chat: next-token prediction
  double rms_norm_eps = 1e-5;
  double rope_theta = 10000;
  int64_t halt_max_steps = 16;
  double halt_exploration_prob = 0.1;
  bool no_ACT_continue = true;

  int64_t prefix_len() const; // P
  int64_t positions() const {
    return prefix_len() + seq_len; // T
  }
  // UserError naming the key for a shape that cannot be built.
  void validate() const;
};

nlohmann::json to_json(const TrmConfig& c);
TrmConfig trm_config_from_json(const nlohmann::json& j);

// SwiGLU's inner width: round(expansion * h * 2/3) up to a multiple of 256.
int64_t swiglu_width(int64_t h, double expansion);

// Upstream's truncated normal (JAX's): values within +-2 of the scaled
// normal, the scale chosen so that the truncated values have std `std`.
void trunc_normal_(torch::Tensor& t, double std);

struct TrmSwiGluImpl : torch::nn::Module {
  TrmSwiGluImpl(int64_t in, double expansion);
  torch::Tensor forward(const torch::Tensor& x);
  torch::nn::Linear gate_up_proj{nullptr}, down_proj{nullptr};
};
TORCH_MODULE(TrmSwiGlu);

struct TrmAttentionImpl : torch::nn::Module {
  TrmAttentionImpl(int64_t hidden, int64_t heads, bool causal);
  // x (B, T, D); cos, sin (T, D / heads) or undefined.
  torch::Tensor forward(
      const torch::Tensor& x,
      const torch::Tensor& cos,
      const torch::Tensor& sin);
  torch::nn::Linear qkv_proj{nullptr}, o_proj{nullptr};
  int64_t heads;
  bool causal;
};
TORCH_MODULE(TrmAttention);

struct TrmBlockImpl : torch::nn::Module {
  explicit TrmBlockImpl(const TrmConfig& c);
  torch::Tensor forward(
      torch::Tensor h,
      const torch::Tensor& cos,
      const torch::Tensor& sin);
  TrmAttention self_attn{nullptr};
  TrmSwiGlu mlp_t{nullptr}, mlp{nullptr};
  double eps;
  int64_t positions; // T: h may carry zero rows after them (TrmImpl::step)
};
TORCH_MODULE(TrmBlock);

struct TrmStepOutput {
  torch::Tensor z_H, z_L;           // the new carry, detached (B, T, D)
  torch::Tensor logits;             // (B, S, V)
  torch::Tensor q_halt, q_continue; // (B) float32 (float64 in a float64 model)
};

struct TrmImpl : torch::nn::Module {
  explicit TrmImpl(TrmConfig c);

  // sqrt(D) * (puzzle prefix ; token embeddings) (+ learned positions):
  // (B, T, D).
  torch::Tensor input_embeddings(
      const torch::Tensor& inputs,
      const torch::Tensor& puzzle_ids);
  // The network on h + injection.
  torch::Tensor net(torch::Tensor h, const torch::Tensor& injection);
  // The starting carry for B puzzles: H_init and L_init at every position.
  std::pair<torch::Tensor, torch::Tensor> initial_carry(int64_t B);
  // One supervision step from (z_H, z_L).
  TrmStepOutput step(
      const torch::Tensor& z_H,
      const torch::Tensor& z_L,
      const torch::Tensor& inputs,
      const torch::Tensor& puzzle_ids);

  // Parameters without the puzzle embedding (the paper's counts: 5,028,866
  // for the Sudoku MLP model, 6,828,034 with attention).
  int64_t network_parameters() const;

  TrmConfig config;
  torch::nn::Embedding embed_tokens{nullptr}, embed_pos{nullptr};
  torch::Tensor puzzle_emb; // (identifiers, puzzle_emb_ndim), zero at first
  torch::nn::Linear lm_head{nullptr}, q_head{nullptr};
  torch::nn::ModuleList L_level{nullptr};
  torch::Tensor H_init, L_init; // buffers (D)
  torch::Tensor cos, sin;       // rope: (T, D / heads)
  // With mlp_t on CUDA the states carry zero rows after the T positions,
  // up to a multiple of 8, for the products (the same result); true does
  // so on every device (the tests).
  bool align_positions_everywhere = false;
};
TORCH_MODULE(Trm);

// Which slots halt after a step (steps already counted up, int64 (B)):
// at halt_max_steps always; in training also when q_halt > 0 (or q_halt >
// q_continue without no_ACT_continue), but not before `minimum` steps
// (exploration_minimum's draw; undefined: no minimum).
torch::Tensor halt_decision(
    const TrmConfig& c,
    const torch::Tensor& steps,
    const torch::Tensor& q_halt,
    const torch::Tensor& q_continue,
    bool training,
    const torch::Tensor& minimum = {});

// Exploration's minimum steps for `slots` slots (int64, on the CPU, from
// the CPU generator): for a share halt_exploration_prob of them, uniform
// over 2..halt_max_steps; 0 for the others.
torch::Tensor exploration_minimum(const TrmConfig& c, int64_t slots);

} // namespace orchard::models
