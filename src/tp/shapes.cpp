#include "cubelm/tp/shapes.hpp"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <utility>

namespace cubelm::tp {

std::int64_t vocab_split(const comm::Layout& layout) {
  const std::int64_t q = layout.side();
  switch (layout.mode) {
  case TensorMode::d1:
    return layout.tp;
  case TensorMode::d2:
  case TensorMode::d3:
    return q * q;
  case TensorMode::none:
    break;
  }
  return 1;
}

ActivationSplit activation_split(const comm::Layout& layout) {
  const int q = layout.side();
  ActivationSplit s;
  switch (layout.mode) {
  case TensorMode::none:
  case TensorMode::d1:
    s.inner = s.heads = layout.tp;
    s.stream_rows = layout.sequence_parallel ? layout.tp : 1;
    break;
  case TensorMode::d2:
    s.sequences = s.outer = s.inner = s.heads = q;
    break;
  case TensorMode::d3:
    s.sequences = q * q;
    s.outer = s.inner = s.heads = q;
    break;
  }
  return s;
}

ParamSplit param_split(const comm::Layout& layout) {
  const int q = layout.side();
  ParamSplit s;
  switch (layout.mode) {
  case TensorMode::none:
  case TensorMode::d1:
    s.matrix = s.column_bias = layout.tp;
    break;
  case TensorMode::d2:
    s.matrix = s.column_bias = s.vector = q * q;
    s.wpe = q;
    break;
  case TensorMode::d3:
    s.matrix = q * q * q;
    s.column_bias = s.vector = s.wpe = q;
    break;
  }
  return s;
}

std::int64_t padded_vocab(const ModelConfig& m, const comm::Layout& layout) {
  const std::int64_t a = std::max(1, m.vocab_divisible_by), b = vocab_split(layout);
  const std::int64_t multiple = a / std::gcd(a, b) * b;
  return (m.vocab_size + multiple - 1) / multiple * multiple;
}

AttentionBlocks attention_blocks(int cp, std::int64_t local) {
  if (cp > 1)
    return {2, local / 2};
  constexpr std::int64_t shortest = 128;
  AttentionBlocks b{1, local};
  while (b.length % 2 == 0 && b.length / 2 >= shortest) {
    b.per_rank *= 2;
    b.length /= 2;
  }
  return b;
}

std::string check_shapes(const comm::Layout& layout, const ModelConfig& m, int micro) {
  const auto divides = [](std::int64_t n, std::int64_t d) { return d > 0 && n % d == 0; };
  const std::int64_t h = m.hidden, f = 4LL * m.hidden;
  const int q = layout.side();
  if (layout.cp > 1 && !divides(m.seq_len, 2LL * layout.cp))
    return "model.seq_len = " + std::to_string(m.seq_len) +
           " divisible by 2 x context_size = " + std::to_string(2 * layout.cp) +
           " (context parallelism: equal chunks)";
  // The tokens of a sequence on this rank (all of them without context parallelism).
  const std::int64_t seq = m.seq_len / layout.cp;
  switch (layout.mode) {
  case TensorMode::none:
    return "";
  case TensorMode::d1:
    if (!divides(m.heads, q))
      return "model.heads = " + std::to_string(m.heads) + " divisible by " + std::to_string(q) +
             " (whole heads per rank)";
    if (!divides(f, q))
      return "4 x model.hidden = " + std::to_string(f) + " divisible by " + std::to_string(q);
    // Sequence parallelism splits the rows of the residual stream, MoE layers the tokens
    // they route: equal blocks.
    if ((layout.sequence_parallel || m.experts > 1) && !divides(micro * seq, q))
      return "the micro-batch's tokens on a rank (" + std::to_string(micro) + " x " +
             (layout.cp > 1 ? "model.seq_len / context_size = " : "model.seq_len = ") +
             std::to_string(micro * seq) + ") divisible by " + std::to_string(q) +
             (layout.sequence_parallel ? " (sequence parallelism: equal blocks of rows)"
                                       : " (MoE layers: an equal share of the tokens per rank)");
    return "";
  case TensorMode::d2:
  case TensorMode::d3: {
    // 2d: a q x q grid, rows of sequences split q ways; 3d: q^2 ways (the a x b plane).
    const int rows = layout.mode == TensorMode::d2 ? q : q * q;
    if (!divides(micro, rows))
      return "the micro-batch (" + std::to_string(micro) + " sequences) divisible by " +
             std::to_string(rows) + " (whole sequences per rank)";
    if (!divides(m.heads, q))
      return "model.heads = " + std::to_string(m.heads) + " divisible by q = " + std::to_string(q);
    for (const auto& [name, n] :
         {std::pair<const char*, std::int64_t>{"model.hidden", h}, {"4 x model.hidden", f}})
      if (!divides(n, static_cast<std::int64_t>(q) * q))
        return std::string(name) + " = " + std::to_string(n) +
               " divisible by q^2 = " + std::to_string(q * q);
    // MoE layers: the q ranks sharing a block of rows each route an equal share of them.
    if (m.experts > 1 && !divides(static_cast<std::int64_t>(micro / rows) * seq, q))
      return "the micro-batch's tokens on a rank (" + std::to_string(micro / rows) + " x " +
             std::to_string(seq) + ") divisible by q = " + std::to_string(q) +
             " (MoE layers: an equal share of the tokens per rank)";
    return "";
  }
  }
  return "";
}

} // namespace cubelm::tp
