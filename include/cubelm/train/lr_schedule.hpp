#pragma once
/// \file
/// \brief The learning-rate schedule (docs/training.md).

#include "cubelm/core/config.hpp"

namespace cubelm::train {

/// \brief lr of step `step` (0-based): linear warmup lr (step+1)/warmup for
/// step < warmup, then cosine from lr to min_lr over the remaining steps:
/// min_lr + (lr - min_lr) (1 + cos(pi r)) / 2 with r = (step - warmup) / (steps - warmup).
double learning_rate(const OptimizerConfig& opt, int steps, int step);

} // namespace cubelm::train
