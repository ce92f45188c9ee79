#pragma once
/// \file
/// \brief The input deck as cubelm runs it: read as a file (io/deck.hpp), then checked
/// against the layout's rules, which belong to the layers that define them: the pipeline's
/// (pipeline::check_plan), the process grid's (comm::Layout), the tensor modes' shapes
/// (tp::check_shapes), context parallelism's chunks and the experts' placement. The layout
/// planner applies the same rules to the layouts it lists.
///
/// A broken rule is a cubelm::Error naming the file, the line, the key, the value and the
/// rule, like the reader's own. No Kokkos, no MPI: `cubelm check` runs it on a login node.

#include "cubelm/core/config.hpp"
#include "cubelm/io/deck.hpp"

#include <string>

namespace cubelm::cost {

/// \brief Throws the first layout rule `read` breaks (docs/deck.md).
void check_layout(const io::ReadDeck& read);

/// \brief Parses deck text and checks it whole; `source` names it in messages.
Deck parse_deck(const std::string& text, const std::string& source = "<string>");
/// \brief Reads a deck file and checks it whole.
Deck load_deck(const std::string& path);

} // namespace cubelm::cost
