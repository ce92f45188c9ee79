// The tensor modes' scratch requests (tp/scratch.hpp), one case per mode.

#include "cubelm/tp/scratch.hpp"

#include "cubelm/tp/shapes.hpp"

#include "scratch_names.hpp"

#include <algorithm>
#include <map>

namespace cubelm::tp {

namespace {

bool sequence_parallel(const comm::Layout& layout) {
  return layout.mode == TensorMode::d1 && layout.sequence_parallel && layout.tp > 1;
}

} // namespace

ScratchRequests linear_scratch(const comm::Layout& layout, std::int64_t in, std::int64_t out,
                               std::int64_t rows, bool second) {
  const std::int64_t q = layout.side();
  switch (layout.mode) {
  case TensorMode::none:
  case TensorMode::d1:
    if (second && sequence_parallel(layout))
      return {{detail::d1::kFull, rows * out}};
    return {};
  case TensorMode::d2: {
    const std::int64_t bi = in / q, bo = out / q;
    using namespace detail::d2;
    return {{kAct, rows * bi},
            {kWeight, bi * bo},
            {kPartial, rows * bi},
            {kWeightPartial, bi * bo},
            {kWeightSum, bi * bo}};
  }
  case TensorMode::d3: {
    const std::int64_t wr = in / (q * q), wc = out / q;
    using namespace detail::d3;
    return {{kInput, rows * q * (in / q)}, {kWeight, (in / q) * wc},
            {kOutput, rows * q * wc},      {kInputGrad, rows * q * (in / q)},
            {kWeightGrad, (in / q) * wc},  {kWeightBlock, wr * wc}};
  }
  }
  return {};
}

ScratchRequests layernorm_scratch(const comm::Layout& layout, std::int64_t features,
                                  std::int64_t rows) {
  if (sequence_parallel(layout))
    return {{detail::d1::kLocal, rows * features}};
  return {};
}

ScratchRequests embedding_scratch(const comm::Layout& layout, bool lookup, bool head, int batch,
                                  std::int64_t positions, std::int64_t hidden,
                                  std::int64_t padded) {
  const std::int64_t q = layout.side(), all = static_cast<std::int64_t>(batch) * positions;
  ScratchRequests out;
  switch (layout.mode) {
  case TensorMode::none:
  case TensorMode::d1:
    if (lookup && sequence_parallel(layout))
      out.push_back({detail::d1::kFull, all * hidden});
    break;
  case TensorMode::d2: {
    using namespace detail::d2;
    const std::int64_t bv = padded / q, bh = hidden / q;
    const std::int64_t rows = static_cast<std::int64_t>(batch / q) * positions;
    if (lookup)
      out.push_back({kPartial, all * bh});
    if (head)
      out.insert(out.end(), {{kPartial, rows * bv},
                             {kWeight, bv * bh},
                             {kAct, rows * bv},
                             {kWeightPartial, bv * bh},
                             {kWeightSum, bv * bh}});
    break;
  }
  case TensorMode::d3: {
    using namespace detail::d3;
    const std::int64_t bv = padded / q, bh = hidden / q;
    const std::int64_t rows = static_cast<std::int64_t>(batch / (q * q)) * positions;
    out.push_back({kWeightBlock, (bv / q) * bh});
    if (lookup)
      out.insert(out.end(), {{kInput, rows * q * bh}, {kOutput, rows * q * bh}});
    if (head)
      out.insert(out.end(),
                 {{kInput, rows * q * bh}, {kOutput, rows * q * bv}, {kInputGrad, rows * q * bh}});
    break;
  }
  }
  return out;
}

std::int64_t stage_scratch(const comm::Layout& layout, const StageParts& p) {
  std::map<std::string_view, std::int64_t> largest;
  auto add = [&](const ScratchRequests& requests) {
    for (const ScratchRequest& r : requests)
      largest[r.name] = std::max(largest[r.name], r.elements);
  };
  const ActivationSplit split = activation_split(layout);
  const std::int64_t rows = static_cast<std::int64_t>(p.batch / split.sequences) * p.positions;
  const std::int64_t stream = rows / split.stream_rows, h = p.hidden;
  const int lns = 2 * p.layers + (p.last ? 1 : 0);
  if (lns > 0)
    add(layernorm_scratch(layout, h, stream));
  if (p.layers > 0) {
    add(linear_scratch(layout, h, h, rows, false)); // qkv
    add(linear_scratch(layout, h, h, rows, true));  // proj
  }
  if (p.layers > p.moe_layers) {
    add(linear_scratch(layout, h, 4 * h, rows, false)); // fc1
    add(linear_scratch(layout, 4 * h, h, rows, true));  // fc2
  }
  if (p.first || p.last)
    add(embedding_scratch(layout, p.first, p.last, p.batch, p.positions, h, p.padded_vocab));
  std::int64_t total = 0;
  for (const auto& [name, elements] : largest)
    total += elements;
  return total;
}

} // namespace cubelm::tp
