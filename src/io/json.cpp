#include "cubelm/io/json.hpp"

#include "cubelm/core/error.hpp"

#include <cstdlib>
#include <limits>
#include <unordered_set>

namespace cubelm::io {

double Json::number() const {
  return kind_ == Kind::number ? std::strtod(text_.c_str(), nullptr) : 0.0;
}

std::optional<std::uint64_t> Json::unsigned_integer() const {
  if (kind_ != Kind::number || text_.empty() || text_.size() > 20)
    return std::nullopt;
  std::uint64_t v = 0;
  for (const char c : text_) {
    if (c < '0' || c > '9')
      return std::nullopt;
    const std::uint64_t digit = static_cast<std::uint64_t>(c - '0');
    if (v > (std::numeric_limits<std::uint64_t>::max() - digit) / 10)
      return std::nullopt;
    v = v * 10 + digit;
  }
  return v;
}

const Json* Json::find(const std::string& key) const {
  for (const auto& [name, value] : members_)
    if (name == key)
      return &value;
  return nullptr;
}

const char* Json::kind_name(Kind kind) {
  switch (kind) {
  case Kind::null:
    return "null";
  case Kind::boolean:
    return "a boolean";
  case Kind::number:
    return "a number";
  case Kind::string:
    return "a string";
  case Kind::array:
    return "an array";
  case Kind::object:
    return "an object";
  }
  return "?";
}

std::string Json::describe() const {
  switch (kind_) {
  case Kind::null:
    return "null";
  case Kind::boolean:
    return boolean_ ? "true" : "false";
  case Kind::number:
    return text_;
  case Kind::string:
    return json_quote(text_.size() > 80 ? text_.substr(0, 80) + "..." : text_);
  default:
    return kind_name(kind_);
  }
}

std::string json_quote(const std::string& s) {
  static const char* hex = "0123456789abcdef";
  std::string q = "\"";
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\')
      q += std::string("\\") + c;
    else if (c == '\n')
      q += "\\n";
    else if (c == '\t')
      q += "\\t";
    else if (u < 0x20)
      q += std::string("\\u00") + hex[u >> 4] + hex[u & 15];
    else
      q += c;
  }
  return q + "\"";
}

// A recursive-descent reader over the whole text; `at_` is the next character.
class JsonParser {
public:
  JsonParser(const std::string& text, const std::string& source) : s_(text), source_(source) {}

  Json document() {
    skip_space();
    Json v = value(0);
    skip_space();
    if (at_ != s_.size())
      fail("unexpected " + here() + " after the end of the document");
    return v;
  }

private:
  static constexpr int kMaxDepth = 64;

  [[noreturn]] void fail(const std::string& rule) const {
    int line = 1, column = 1;
    for (std::size_t i = 0; i < at_ && i < s_.size(); ++i) {
      if (s_[i] == '\n') {
        ++line;
        column = 1;
      } else {
        ++column;
      }
    }
    throw Error(source_ + ": line " + std::to_string(line) + ", column " + std::to_string(column) +
                ": " + rule + " (JSON, RFC 8259)");
  }

  // The character at the cursor, for messages.
  std::string here() const {
    if (at_ >= s_.size())
      return "end of the text";
    const auto c = static_cast<unsigned char>(s_[at_]);
    if (c >= 0x20 && c < 0x7f)
      return std::string("'") + static_cast<char>(c) + "'";
    return "byte " + std::to_string(c);
  }

  void skip_space() {
    while (at_ < s_.size() &&
           (s_[at_] == ' ' || s_[at_] == '\t' || s_[at_] == '\n' || s_[at_] == '\r'))
      ++at_;
  }

  bool take(const char* word) {
    std::size_t n = 0;
    while (word[n] != '\0')
      ++n;
    if (s_.compare(at_, n, word) != 0)
      return false;
    at_ += n;
    return true;
  }

  Json value(int depth) {
    if (depth > kMaxDepth)
      fail("values nested deeper than " + std::to_string(kMaxDepth) + " levels");
    Json v;
    if (at_ >= s_.size())
      fail("a value expected, found the end of the text");
    const char c = s_[at_];
    if (c == '{') {
      v.kind_ = Json::Kind::object;
      object(v, depth);
    } else if (c == '[') {
      v.kind_ = Json::Kind::array;
      array(v, depth);
    } else if (c == '"') {
      v.kind_ = Json::Kind::string;
      v.text_ = string();
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      v.kind_ = Json::Kind::number;
      v.text_ = number();
    } else if (take("true")) {
      v.kind_ = Json::Kind::boolean;
      v.boolean_ = true;
    } else if (take("false")) {
      v.kind_ = Json::Kind::boolean;
    } else if (!take("null")) {
      fail("a value expected, found " + here());
    }
    return v;
  }

  void object(Json& v, int depth) {
    ++at_; // '{'
    skip_space();
    if (at_ < s_.size() && s_[at_] == '}') {
      ++at_;
      return;
    }
    // The keys so far, for the duplicate check in constant time: vocab.json has 50257.
    std::unordered_set<std::string> keys;
    for (;;) {
      skip_space();
      if (at_ >= s_.size() || s_[at_] != '"')
        fail("a member name (a string) expected, found " + here());
      const std::size_t key_at = at_;
      std::string key = string();
      if (!keys.insert(key).second) {
        at_ = key_at;
        fail("the key " + json_quote(key) + " appears twice in one object");
      }
      skip_space();
      if (at_ >= s_.size() || s_[at_] != ':')
        fail("':' expected after the member name " + json_quote(key) + ", found " + here());
      ++at_;
      skip_space();
      Json member = value(depth + 1);
      v.members_.emplace_back(std::move(key), std::move(member));
      skip_space();
      if (at_ < s_.size() && s_[at_] == ',') {
        ++at_;
        continue;
      }
      if (at_ < s_.size() && s_[at_] == '}') {
        ++at_;
        return;
      }
      fail("',' or '}' expected in an object, found " + here());
    }
  }

  void array(Json& v, int depth) {
    ++at_; // '['
    skip_space();
    if (at_ < s_.size() && s_[at_] == ']') {
      ++at_;
      return;
    }
    for (;;) {
      skip_space();
      v.elements_.push_back(value(depth + 1));
      skip_space();
      if (at_ < s_.size() && s_[at_] == ',') {
        ++at_;
        continue;
      }
      if (at_ < s_.size() && s_[at_] == ']') {
        ++at_;
        return;
      }
      fail("',' or ']' expected in an array, found " + here());
    }
  }

  // -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
  std::string number() {
    const std::size_t start = at_;
    const auto digits = [&] {
      const std::size_t from = at_;
      while (at_ < s_.size() && s_[at_] >= '0' && s_[at_] <= '9')
        ++at_;
      return at_ > from;
    };
    if (s_[at_] == '-')
      ++at_;
    if (at_ < s_.size() && s_[at_] == '0')
      ++at_;
    else if (!digits())
      fail("a digit expected in a number, found " + here());
    if (at_ < s_.size() && s_[at_] == '.') {
      ++at_;
      if (!digits())
        fail("a digit expected after the decimal point, found " + here());
    }
    if (at_ < s_.size() && (s_[at_] == 'e' || s_[at_] == 'E')) {
      ++at_;
      if (at_ < s_.size() && (s_[at_] == '+' || s_[at_] == '-'))
        ++at_;
      if (!digits())
        fail("a digit expected in the exponent, found " + here());
    }
    return s_.substr(start, at_ - start);
  }

  unsigned hex4() {
    unsigned v = 0;
    for (int i = 0; i < 4; ++i, ++at_) {
      if (at_ >= s_.size())
        fail("4 hexadecimal digits expected after \\u, found the end of the text");
      const char c = s_[at_];
      const unsigned d = c >= '0' && c <= '9'   ? static_cast<unsigned>(c - '0')
                         : c >= 'a' && c <= 'f' ? static_cast<unsigned>(c - 'a' + 10)
                         : c >= 'A' && c <= 'F' ? static_cast<unsigned>(c - 'A' + 10)
                                                : 16u;
      if (d == 16)
        fail("4 hexadecimal digits expected after \\u, found " + here());
      v = v * 16 + d;
    }
    return v;
  }

  static void append_utf8(std::string& out, unsigned cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xc0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xe0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    } else {
      out += static_cast<char>(0xf0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    }
  }

  std::string string() {
    ++at_; // '"'
    std::string out;
    for (;;) {
      if (at_ >= s_.size())
        fail("the string is not closed (no '\"' before the end of the text)");
      const char c = s_[at_];
      if (c == '"') {
        ++at_;
        return out;
      }
      if (static_cast<unsigned char>(c) < 0x20)
        fail("control character (byte " + std::to_string(static_cast<unsigned char>(c)) +
             ") inside a string: it must be escaped");
      if (c != '\\') {
        out += c;
        ++at_;
        continue;
      }
      ++at_;
      if (at_ >= s_.size())
        fail("an escape expected after '\\', found the end of the text");
      const char e = s_[at_++];
      switch (e) {
      case '"':
      case '\\':
      case '/':
        out += e;
        break;
      case 'b':
        out += '\b';
        break;
      case 'f':
        out += '\f';
        break;
      case 'n':
        out += '\n';
        break;
      case 'r':
        out += '\r';
        break;
      case 't':
        out += '\t';
        break;
      case 'u': {
        unsigned cp = hex4();
        if (cp >= 0xd800 && cp < 0xdc00) { // a surrogate pair
          if (!take("\\u"))
            fail("a high surrogate \\u escape must be followed by a low one");
          const unsigned low = hex4();
          if (low < 0xdc00 || low >= 0xe000)
            fail("a high surrogate \\u escape must be followed by a low one");
          cp = 0x10000 + ((cp - 0xd800) << 10) + (low - 0xdc00);
        } else if (cp >= 0xdc00 && cp < 0xe000) {
          fail("a low surrogate \\u escape without a high one");
        }
        append_utf8(out, cp);
        break;
      }
      default:
        --at_;
        fail("unknown escape '\\" + std::string(1, e) + "' in a string");
      }
    }
  }

  const std::string& s_;
  const std::string& source_;
  std::size_t at_ = 0;
};

Json parse_json(const std::string& text, const std::string& source) {
  return JsonParser(text, source).document();
}

} // namespace cubelm::io
