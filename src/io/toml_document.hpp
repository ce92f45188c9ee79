#pragma once
// A TOML document as plain values, for the deck reader. toml_document.cpp is
// the only translation unit that includes toml++: it is built by the host
// compiler alone (cubelm_toml), because nvcc cannot parse toml++, and it knows
// nothing of cubelm. Everything else reads these structs.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace cubelm::io::toml_doc {

/// \brief One TOML value. Tables keep their members in the parser's order.
struct Value {
  enum class Type { integer, floating, boolean, string, table, other };
  Type type = Type::other;
  std::int64_t integer = 0;
  double floating = 0.0;
  bool boolean = false;
  std::string string;
  std::string text;      ///< as the user most likely wrote it (strings in double quotes)
  std::string type_name; ///< TOML's name of the type: "integer", "string", "array", ...
  int line = 0;          ///< 0 when unknown
  std::vector<std::pair<std::string, Value>> members; ///< a table's keys and values

  /// \brief The member called `key`, or nullptr (also when this is not a table).
  const Value* find(const std::string& key) const {
    for (const auto& [k, v] : members)
      if (k == key)
        return &v;
    return nullptr;
  }
};

/// \brief The outcome of reading a document: its root table, or what is wrong.
struct Parsed {
  Value root;
  bool ok = false;
  int line = 0, column = 0; ///< where the error is, when !ok
  std::string error;        ///< the parser's description, when !ok
};

/// \brief Parses TOML text; `source` names it in the parser's messages.
Parsed parse(const std::string& text, const std::string& source);

} // namespace cubelm::io::toml_doc
