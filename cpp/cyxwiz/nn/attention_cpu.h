// Self-attention's core on the CPU, all heads of a batch: from the projections Q, K, V (rows of the
// (N*T, 3E) buffer in_proj writes) to the heads' outputs side by side (N*T, E), and back.
//
// Blocked, in the manner of FlashAttention: a task is one (sample, head); it takes 64 queries at a time
// against the keys they may see (all, or up to the block's last query when causal: the masked half is
// never computed), so the scores live in a 64 x T scratch per thread, never (N, H, T, T). Forward keeps
// one number per query, the log-sum-exp of its scores; backward recomputes the weights from it.
// Dropout on the weights draws its keep/drop decisions from a counter-based hash of (seed, sample, head,
// query, key), so backward redraws them and the mask is never stored either.
#pragma once

#include <cstdint>

namespace cyxwiz::nn::attention_cpu {

struct Dims {
  int64_t n, t, e, heads;  // batch, sequence length, embed_dim, heads (head size e / heads)
  bool causal;             // query i sees keys 0..i
};

struct Dropout {
  float keep = 1.0f;   // 1: off
  uint64_t seed = 0;   // one draw of the engine's generator per forward
  bool on() const { return keep < 1.0f; }
};

// y (R, out) = x (R, in) w^T (+ b), row-major: the projections in and out of the heads.
void project(const float* x, const float* w, const float* b, float* y, int64_t R, int64_t in, int64_t out);

// qkv (N*T, 3E) -> out (N*T, E); lse (N, H, T): each query's log-sum-exp of its scaled scores.
void forward(const Dims& d, const Dropout& drop, const float* qkv, float* out, float* lse);

// dout (N*T, E) -> dqkv (N*T, 3E), overwritten; lse as forward left it.
void backward(const Dims& d, const Dropout& drop, const float* qkv, const float* lse, const float* dout, float* dqkv);

}  // namespace cyxwiz::nn::attention_cpu
