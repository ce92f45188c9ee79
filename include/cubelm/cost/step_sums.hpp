#pragma once
/// \file
/// \brief The step's one reduction over the world: what every rank adds up at the end of
/// a training step, in double. The trainer fills and reads it (train/trainer.cpp); the
/// traffic closed form and the predictor count its values, so it is described here, below
/// both. Stop requests ride on it, so stopping costs no collective of its own.

#include "cubelm/core/config.hpp"

#include <cstddef>

namespace cubelm::cost {

struct StepSums {
  double loss = 0;         ///< summed token losses (the last stage's tensor rank 0 only)
  double grad_squares = 0; ///< this rank's share of the squared gradient norm
  double sigterm = 0;      ///< 1 where SIGTERM was seen
  double sigusr1 = 0;      ///< 1 where SIGUSR1 was seen
  double deadline = 0;     ///< 1 where the time limit is near
  double aux = 0;          ///< the MoE layers' load-balancing loss (MoE models only)
  double save_pending = 0; ///< 1 where a background checkpoint write is still running
  double save_failed = 0;  ///< 1 where a finished background write failed

  /// \brief The values reduced for `deck`: the load-balancing loss when the model has MoE
  /// layers; the background writes' state (after it) under checkpoint.async.
  static int count(const Deck& deck) {
    return deck.checkpoint.async ? 8 : deck.model.experts > 1 ? 6 : 5;
  }
  static constexpr int kMost = 8;

  /// \brief The first `n` values, in reduction order, into `values`.
  void pack(double* values, int n) const {
    const double all[kMost] = {loss,     grad_squares, sigterm,      sigusr1,
                               deadline, aux,          save_pending, save_failed};
    for (int i = 0; i < n; ++i)
      values[i] = all[i];
  }
  /// \brief The sums from the first `n` values of `values` (the others 0).
  static StepSums unpack(const double* values, int n) {
    double all[kMost] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int i = 0; i < n; ++i)
      all[i] = values[i];
    return StepSums{all[0], all[1], all[2], all[3], all[4], all[5], all[6], all[7]};
  }
};

} // namespace cubelm::cost
