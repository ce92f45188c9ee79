#pragma once
/// \file
/// \brief The TOML input deck: reads a cubelm::Deck (core/config.hpp) and validates it.
///
/// Every key and its default is listed in docs/deck.md. Unknown keys, wrong
/// types and impossible values are cubelm::Error messages that name the file,
/// the line, the key, the value and the rule. Validation needs no MPI and
/// allocates nothing, so `cubelm check` can run it on a login node.

#include "cubelm/core/config.hpp"

#include <string>

namespace cubelm::io {

/// \brief Parses and validates deck text; `source` names it in messages.
Deck parse_deck(const std::string& text, const std::string& source = "<string>");
/// \brief Reads and validates a deck file.
Deck load_deck(const std::string& path);

} // namespace cubelm::io
