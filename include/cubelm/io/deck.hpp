#pragma once
/// \file
/// \brief The TOML input deck as a file: reads a cubelm::Deck (core/config.hpp) and checks
/// each key's own rules.
///
/// Every key and its default is listed in docs/deck.md. Unknown sections and keys, wrong
/// types and values a key refuses on its own are cubelm::Error messages that name the file,
/// the line, the key, the value and the rule. The rules that tie the parallel layout to the
/// model and the batch (the pipeline's, the tensor modes' shapes, the experts' placement)
/// belong to the layers that define them; cost/deck.hpp checks them after reading, with the
/// lines kept here, and is what programs call. Reading needs no MPI and allocates nothing.

#include "cubelm/core/config.hpp"

#include <map>
#include <string>
#include <utility>

namespace cubelm::io {

/// \brief Where each key of a deck was written, so that a rule checked after reading names
/// the line and the value as the reader's own rules do.
class DeckKeys {
public:
  explicit DeckKeys(std::string source = "<string>") : source_(std::move(source)) {}

  /// \brief Records `key` ("section.name") written at `line` (0: unknown) as `text`.
  void add(const std::string& key, int line, std::string text);

  /// \brief Throws the cubelm::Error "source:line: key = text: rule"; `fallback` is the
  /// value shown (as the default) when the deck does not set the key.
  [[noreturn]] void fail(const std::string& key, const std::string& rule,
                         const std::string& fallback = "") const;

private:
  std::string source_;
  std::map<std::string, std::pair<int, std::string>> written_;
};

/// \brief A deck as read, with where its keys were written.
struct ReadDeck {
  Deck deck;
  DeckKeys keys;
};

/// \brief Reads deck text and checks each key's own rules; `source` names it in messages.
ReadDeck read_deck(const std::string& text, const std::string& source = "<string>");
/// \brief Reads a deck file and checks each key's own rules.
ReadDeck read_deck_file(const std::string& path);

} // namespace cubelm::io
