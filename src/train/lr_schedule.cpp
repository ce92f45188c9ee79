#include "cubelm/train/lr_schedule.hpp"

#include <algorithm>
#include <cmath>

namespace cubelm::train {

double learning_rate(const OptimizerConfig& opt, int steps, int step) {
  if (step < opt.warmup_steps)
    return opt.lr * (step + 1) / opt.warmup_steps;
  // As llm.c: the decay ratio runs over [0, 1) for steps warmup .. steps-1.
  const int decay_steps = steps - opt.warmup_steps;
  if (decay_steps <= 0)
    return opt.lr;
  const double progress = static_cast<double>(step - opt.warmup_steps) / decay_steps;
  const double pi = 3.141592653589793;
  return opt.min_lr + 0.5 * (opt.lr - opt.min_lr) * (1.0 + std::cos(pi * std::min(1.0, progress)));
}

} // namespace cubelm::train
