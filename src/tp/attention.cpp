// Causal self-attention on the block kernels, with or without context parallelism
// (tp/attention.hpp; docs/grid.md, "Context parallelism").

#include "cubelm/tp/attention.hpp"

#include "cubelm/core/error.hpp"
#include "cubelm/kernels/attention_blocks.hpp"
#include "cubelm/kernels/precision.hpp"
#include "cubelm/tp/buffers.hpp"
#include "cubelm/tp/shapes.hpp"

#include "buffer_names.hpp"

#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

namespace cubelm::tp {

namespace {
std::string label(std::string_view name) {
  return "cubelm::" + std::string(name);
}
template <class T>
kernels::Batch<T> batch(std::string_view name, std::int64_t n, std::int64_t rows,
                        std::int64_t cols) {
  return kernels::Batch<T>(Kokkos::view_alloc(Kokkos::WithoutInitializing, label(name)), n, rows,
                           cols);
}
template <class T>
kernels::Tensor4<T> blocks(std::string_view name, std::int64_t count, std::int64_t n,
                           std::int64_t rows, std::int64_t cols) {
  return kernels::Tensor4<T>(Kokkos::view_alloc(Kokkos::WithoutInitializing, label(name)), count, n,
                             rows, cols);
}
// A block tensor as one flat vector (its span is contiguous).
template <class V>
kernels::Vec<typename V::value_type> flat(const V& view) {
  return kernels::Vec<typename V::value_type>(view.data(), view.span());
}
} // namespace

template <class T>
BlockAttention<T>::BlockAttention(const comm::Group* group, int sequences, int heads, int local,
                                  int head_dim)
    : group_(group), cp_(group != nullptr ? group->size() : 1),
      rank_(group != nullptr ? group->rank() : 0), heads_(heads),
      n_(static_cast<std::int64_t>(sequences) * heads), d_(head_dim) {
  CUBELM_ASSERT(cp_ == 1 || (local % 2 == 0 && local > 0),
                "context parallelism holds 2 equal chunks of each sequence per rank, got " +
                    std::to_string(local) + " tokens");
  const AttentionBlocks cut = attention_blocks(cp_, local);
  per_rank_ = cut.per_rank;
  chunk_ = cut.length;
  using namespace detail::attn;
  const std::int64_t kv = 2LL * per_rank_;
  mine_ = blocks<G>(kKv, kv, n_, chunk_, d_);
  dmine_ = blocks<G>(kDkv, kv, n_, chunk_, d_);
  if (cp_ > 1) {
    all_ = blocks<G>(kKvAll, kv * cp_, n_, chunk_, d_);
    dall_ = blocks<G>(kDkvAll, kv * cp_, n_, chunk_, d_);
  } else { // the gathered blocks are this rank's own
    all_ = mine_;
    dall_ = dmine_;
  }
  if constexpr (!std::is_same_v<T, G>)
    if (cp_ > 1) { // the blocks travel as the model stores them
      sent_ = kernels::Vec<T>(Kokkos::view_alloc(Kokkos::WithoutInitializing, label(kKvSent)),
                              mine_.span());
      received_ = kernels::Vec<T>(
          Kokkos::view_alloc(Kokkos::WithoutInitializing, label(kKvReceived)), all_.span());
    }
  q_ = batch<G>(kQ, n_, chunk_, d_);
  o_ = batch<G>(kOut, n_, chunk_, d_);
  part_ = batch<G>(kPart, n_, chunk_, d_);
  dout_ = batch<G>(kDout, n_, chunk_, d_);
  dq_ = batch<G>(kDq, n_, chunk_, d_);
  scores_ = batch<G>(kScores, n_, chunk_, chunk_);
  dscores_ = batch<G>(kDscores, n_, chunk_, chunk_);
  part_lse_ = kernels::Mat<G>(label(kPartLse), n_, chunk_);
  delta_ = kernels::Mat<G>(label(kDelta), n_, chunk_);
  // What was allocated is what the memory estimate reads (tp/buffers.hpp).
  BufferSizes allocated;
  auto add = [&](std::string_view name, std::size_t span, Holds holds = Holds::compute) {
    allocated.emplace(name, Buffer{name, static_cast<std::int64_t>(span), holds});
  };
  if (sent_.span() > 0) {
    add(kKvSent, sent_.span(), Holds::values);
    add(kKvReceived, received_.span(), Holds::values);
  }
  add(kKv, mine_.span());
  add(kDkv, dmine_.span());
  if (cp_ > 1) {
    add(kKvAll, all_.span());
    add(kDkvAll, dall_.span());
  }
  add(kQ, q_.span());
  add(kOut, o_.span());
  add(kPart, part_.span());
  add(kDout, dout_.span());
  add(kDq, dq_.span());
  add(kScores, scores_.span());
  add(kDscores, dscores_.span());
  add(kPartLse, part_lse_.span());
  add(kDelta, delta_.span());
  BufferSizes described;
  for (const Buffer& b :
       attention_buffers(cp_, sequences, heads, local, head_dim, static_cast<int>(sizeof(T))))
    described.emplace(b.name, b);
  const std::string differs = compare_buffers(allocated, described);
  CUBELM_ASSERT(differs.empty(), "attention's buffers: " + differs);
  bytes_ = bytes_of(allocated, static_cast<int>(sizeof(T)));
}

template <class T>
kernels::Batch<compute_t<T>> BlockAttention<T>::make_saved() const {
  return batch<G>(detail::attn::kLse, per_rank_, n_, chunk_);
}

template <class T>
int BlockAttention<T>::mine(int j) const {
  if (cp_ == 1)
    return j;
  return j == 0 ? rank_ : 2 * cp_ - 1 - rank_;
}

template <class T>
kernels::Batch<compute_t<T>> BlockAttention<T>::block(const kernels::Tensor4<G>& blocks, int g,
                                                      int kv) const {
  // With context parallelism chunk g < cp is rank g's first, chunk g >= cp rank
  // 2 cp - 1 - g's second; on one rank block g is the rank's g-th.
  const int r = cp_ == 1 ? 0 : g < cp_ ? g : 2 * cp_ - 1 - g;
  const int j = cp_ == 1 ? g : g < cp_ ? 0 : 1;
  return Kokkos::subview(blocks, 2 * per_rank_ * r + per_rank_ * kv + j, Kokkos::ALL, Kokkos::ALL,
                         Kokkos::ALL);
}

template <class T>
void BlockAttention<T>::gather_keys(const ExecSpace& exec, const kernels::Mat<T>& k,
                                    const kernels::Mat<T>& v) const {
  for (int kv = 0; kv < 2; ++kv)
    for (int j = 0; j < per_rank_; ++j)
      kernels::gather_heads<T>(
          exec, kv == 0 ? k : v, heads_, j * chunk_,
          Kokkos::subview(mine_, per_rank_ * kv + j, Kokkos::ALL, Kokkos::ALL, Kokkos::ALL));
  if (cp_ == 1)
    return;
  if constexpr (std::is_same_v<T, G>) {
    group_->all_gather(exec, mine_, all_);
  } else { // bf16 on the wire: the blocks hold bf16 values, so both conversions are exact
    kernels::convert(exec, flat(mine_), sent_);
    group_->all_gather(exec, sent_, received_);
    kernels::convert(exec, received_, flat(all_));
  }
}

template <class T>
void BlockAttention<T>::forward(const ExecSpace& exec, const kernels::Mat<T>& q,
                                const kernels::Mat<T>& k, const kernels::Mat<T>& v,
                                const kernels::Batch<G>& saved, const kernels::Mat<T>& out) const {
  gather_keys(exec, k, v);
  for (int j = 0; j < per_rank_; ++j) {
    const int m = mine(j);
    const kernels::Mat<G> lse = Kokkos::subview(saved, j, Kokkos::ALL, Kokkos::ALL);
    kernels::gather_heads<T>(exec, q, heads_, j * chunk_, q_);
    // Key blocks in order of position, 0 to m: the later ones are all masked.
    for (int g = 0; g <= m; ++g) {
      const bool first = g == 0;
      kernels::attention_block_forward<G>(exec, q_, block(all_, g, 0), block(all_, g, 1),
                                          m * chunk_, g * chunk_, scores_, first ? o_ : part_,
                                          first ? lse : part_lse_);
      if (!first)
        kernels::attention_combine<G>(exec, o_, lse, part_, part_lse_);
    }
    kernels::scatter_heads<T>(exec, o_, heads_, j * chunk_, out);
  }
}

template <class T>
void BlockAttention<T>::backward(const ExecSpace& exec, const kernels::Mat<T>& q,
                                 const kernels::Mat<T>& k, const kernels::Mat<T>& v,
                                 const kernels::Mat<T>& out, const kernels::Batch<G>& saved,
                                 const kernels::Mat<T>& dout, const kernels::Mat<T>& dq,
                                 const kernels::Mat<T>& dk, const kernels::Mat<T>& dv) const {
  gather_keys(exec, k, v);
  Kokkos::deep_copy(exec, dall_, G(0));
  for (int j = 0; j < per_rank_; ++j) {
    const int m = mine(j);
    const kernels::Mat<G> lse = Kokkos::subview(saved, j, Kokkos::ALL, Kokkos::ALL);
    kernels::gather_heads<T>(exec, q, heads_, j * chunk_, q_);
    kernels::gather_heads<T>(exec, out, heads_, j * chunk_, o_);
    kernels::gather_heads<T>(exec, dout, heads_, j * chunk_, dout_);
    kernels::attention_block_delta<G>(exec, o_, dout_, delta_);
    Kokkos::deep_copy(exec, dq_, G(0));
    for (int g = 0; g <= m; ++g)
      kernels::attention_block_backward<G>(exec, q_, block(all_, g, 0), block(all_, g, 1), dout_,
                                           lse, delta_, m * chunk_, g * chunk_, scores_, dscores_,
                                           dq_, block(dall_, g, 0), block(dall_, g, 1));
    kernels::scatter_heads<T>(exec, dq_, heads_, j * chunk_, dq);
  }
  // Each rank's keys and values collect the gradients of every rank's queries; in a bf16
  // model the gradients travel as bf16 too (summed in float, rounded).
  if (cp_ > 1) {
    if constexpr (std::is_same_v<T, G>) {
      group_->reduce_scatter(exec, dall_, dmine_);
    } else {
      kernels::convert(exec, flat(dall_), received_);
      group_->reduce_scatter(exec, received_, sent_);
      kernels::convert(exec, sent_, flat(dmine_));
    }
  }
  for (int kv = 0; kv < 2; ++kv)
    for (int j = 0; j < per_rank_; ++j)
      kernels::scatter_heads<T>(
          exec, Kokkos::subview(dmine_, per_rank_ * kv + j, Kokkos::ALL, Kokkos::ALL, Kokkos::ALL),
          heads_, j * chunk_, kv == 0 ? dk : dv);
}

template class BlockAttention<float>;
template class BlockAttention<double>;
template class BlockAttention<bf16>;

} // namespace cubelm::tp
