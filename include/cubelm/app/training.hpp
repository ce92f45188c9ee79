#pragma once
/// \file
/// \brief The `cubelm train` driver: a whole run with what it prints, its metrics
/// file and its checkpoint schedule, around train::Trainer.

#include "cubelm/core/config.hpp"

#include <ostream>

namespace cubelm::app {

/// \brief Trains the deck from step 0 or from its checkpoint.resume; world rank 0
/// prints to `out`. Returns the exit code.
int run_training(const Deck& deck, std::ostream& out);

} // namespace cubelm::app
