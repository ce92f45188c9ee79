#pragma once
/// \file
/// \brief A small JSON reader (RFC 8259) for the files cubelm reads but does not own:
/// the header of a safetensors file, a Hugging Face config.json (docs/training.md,
/// "Hugging Face GPT-2") and the vocab.json of GPT-2's BPE (docs/data.md).
///
/// A document is read whole into a tree of Json values. Numbers keep their text, so an
/// integer is exact whatever its size (safetensors offsets are 64-bit). A syntax error,
/// a duplicate key in an object or nesting deeper than 64 levels is a cubelm::Error
/// naming the source, the line and column and the rule. No Kokkos, no MPI.

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace cubelm::io {

/// \brief One JSON value: null, true/false, a number, a string, an array or an object.
class Json {
public:
  enum class Kind { null, boolean, number, string, array, object };

  Kind kind() const { return kind_; }
  bool is_null() const { return kind_ == Kind::null; }
  bool is_boolean() const { return kind_ == Kind::boolean; }
  bool is_number() const { return kind_ == Kind::number; }
  bool is_string() const { return kind_ == Kind::string; }
  bool is_array() const { return kind_ == Kind::array; }
  bool is_object() const { return kind_ == Kind::object; }

  /// \brief The value of true/false (false for any other kind).
  bool boolean() const { return boolean_; }
  /// \brief A number's value as a double (0 for any other kind).
  double number() const;
  /// \brief A number written as a non-negative integer without fraction or exponent that
  /// fits 64 bits ("1024"), exactly; std::nullopt otherwise ("1e3", "-1", "1.0", "x").
  std::optional<std::uint64_t> unsigned_integer() const;
  /// \brief A string's characters (UTF-8, escapes resolved); a number's text as written.
  const std::string& text() const { return text_; }
  /// \brief An array's elements (empty for any other kind).
  const std::vector<Json>& elements() const { return elements_; }
  /// \brief An object's members in the order written (empty for any other kind).
  const std::vector<std::pair<std::string, Json>>& members() const { return members_; }
  /// \brief The member `key` of an object, or null when there is none (or no object).
  const Json* find(const std::string& key) const;

  /// \brief How a message names the value: `"gpt2"`, `768`, `null`, `an array`, `an object`.
  std::string describe() const;
  /// \brief "null", "a boolean", "a number", "a string", "an array", "an object".
  static const char* kind_name(Kind kind);

private:
  friend class JsonParser;
  Kind kind_ = Kind::null;
  bool boolean_ = false;
  std::string text_;
  std::vector<Json> elements_;
  std::vector<std::pair<std::string, Json>> members_;
};

/// \brief Parses one JSON document (surrounding whitespace allowed); `source` names it
/// in messages ("DIR/config.json"). Errors: cubelm::Error "source: line L, column C: rule".
Json parse_json(const std::string& text, const std::string& source);

/// \brief `s` as a JSON string literal: quoted, with `"`, `\` and control characters escaped.
std::string json_quote(const std::string& s);

} // namespace cubelm::io
