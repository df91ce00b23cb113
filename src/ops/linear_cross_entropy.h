// The summed cross-entropy of a linear head's logits h W^T (soft-capped,
// cap * tanh(z / cap), when a cap is given) against targets, over chunks of
// rows, with the gradients taken in the forward while each chunk's logits
// exist: for h always (when it wants one), and for W when W is trained.
// The (rows, V) logits are never held whole and are computed once; every
// elementwise pass runs over a chunk small enough to stay in cache (on
// CUDA one kernel instead, reading the logits in autocast's dtype and
// writing their gradient over them: cuda::softcap_cross_entropy; there the
// head is padded with zero rows to a multiple of 128 for the products,
// and the padded columns are left out of the softmax). Used
// by the frozen head of a LoRA run and by Orchard's GPT, whose soft-capped
// loss this is (nanochat's cap of 15).
//
// With p the softmax of the capped logits s, t = tanh(z / cap) and g the
// incoming gradient:
//   ds = p - onehot(target)     (0 for an ignored row)
//   dz = ds (1 - t^2)           (ds without a cap)
//   dh = g dz W,   dW = g dz^T h
#pragma once

#include <torch/torch.h>

#include <cstdint>

namespace orchard::ops {

// h (N, C), w (V, C), targets (N) with -1 ignored; chunk: rows per chunk
// (0: the op's choice for h's device, default_chunk_rows); softcap: 0 for
// none. Float32 arithmetic (float64 for float64 inputs);
// under autocast the products run in its dtype. Gradients flow to h, and
// to w when it requires them.
torch::Tensor linear_cross_entropy(
    const torch::Tensor& h,
    const torch::Tensor& w,
    const torch::Tensor& targets,
    int64_t chunk,
    double softcap = 0);

// Rows a chunk takes by default: about 1M logits (4 MB in float32) on the
// CPU, where the elementwise passes then run in cache (the whole logits
// of a batch are tens of MB); about 16M on MPS, where the products want
// many rows and launches are dear; about 256M on CUDA, where one kernel
// takes a chunk in bfloat16 (512 MB; a GPT-2-sized batch of 16 x 1024 is
// four chunks) and each chunk adds its (V, C) product to the head's
// gradient, a pass over it that larger chunks make rarer.
int64_t default_chunk_rows(c10::DeviceType device, int64_t vocab);

// Its plain definition, the test oracle: the summed cross-entropy of the
// whole (N, V) logits h W^T, capped, in the same arithmetic dtype.
torch::Tensor linear_cross_entropy_reference(
    const torch::Tensor& h,
    const torch::Tensor& w,
    const torch::Tensor& targets,
    double softcap = 0);

} // namespace orchard::ops
