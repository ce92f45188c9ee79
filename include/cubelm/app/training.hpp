#pragma once
/// \file
/// \brief The `cubelm train` driver: a whole run with what it prints, its metrics
/// file and its checkpoint schedule, around train::Trainer.

#include "cubelm/core/config.hpp"

#include <ostream>

namespace cubelm::app {

/// \brief Collective over MPI_COMM_WORLD: throws a collective cubelm::Error naming
/// the need and the available memory of the rank with the least room, and the deck
/// keys that lower the need, when a rank's estimate (cost::estimate_memory of its
/// pipeline stage) exceeds its usable memory (core/memory_check.hpp). Allocates nothing.
void admit_memory(const Deck& deck);

/// \brief Trains the deck from step 0 or from its checkpoint.resume; world rank 0
/// prints to `out`. Calls admit_memory first. Returns the exit code.
int run_training(const Deck& deck, std::ostream& out);

} // namespace cubelm::app
