#pragma once
/// \file
/// \brief The shapes a tensor-parallel mode can split: every rank must hold whole
/// heads, whole sequences and equal blocks of each tensor (docs/tensor-parallel.md).
///
/// One rule for everyone: the deck reports it with the key to change, the model
/// checks it before it asks its mode for layers. Pure arithmetic, no Kokkos.

#include "cubelm/comm/layout.hpp"
#include "cubelm/core/config.hpp"

#include <string>

namespace cubelm::tp {

/// \brief The first rule `layout`'s tensor mode breaks for `model` with micro-batches of
/// `micro` sequences, naming the deck key (e.g. "model.heads = 6 divisible by 4 (whole
/// heads per rank)"), or "" when the model splits evenly. `layout` must be valid.
///  - 1d (p ranks): heads, 4 x hidden and vocab_size divisible by p;
///  - 2d (q x q): the micro-batch and heads by q; hidden, 4 x hidden and vocab_size by q^2;
///  - 3d (q x q x q): the micro-batch by q^2, heads by q; hidden, 4 x hidden and
///    vocab_size by q^2.
std::string check_shapes(const comm::Layout& layout, const ModelConfig& model, int micro);

} // namespace cubelm::tp
