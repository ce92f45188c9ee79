#include "toml_document.hpp"

#include <toml++/toml.h>

#include <cstdio>
#include <cstdlib>
#include <sstream>

namespace cubelm::io::toml_doc {

namespace {

// A float as messages show it: the fewest digits that give the same double back, with a
// point or an exponent as TOML writes floats (0.6, 1.0, 1e-08, inf).
std::string shortest_text(double x) {
  char buf[40];
  for (int digits = 1; digits <= 17; ++digits) {
    std::snprintf(buf, sizeof(buf), "%.*g", digits, x);
    if (std::strtod(buf, nullptr) == x || x != x)
      break;
  }
  std::string text = buf;
  if (text.find_first_of(".eEin") == std::string::npos)
    text += ".0";
  return text;
}

Value convert(const toml::node& node) {
  Value v;
  v.line = static_cast<int>(node.source().begin.line);
  {
    std::ostringstream type;
    type << node.type();
    v.type_name = type.str();
  }
  if (node.is_string()) { // as the user most likely wrote it (toml++ prints 'literal' strings)
    v.type = Value::Type::string;
    v.string = node.as_string()->get();
    v.text = "\"" + v.string + "\"";
  } else if (node.is_floating_point()) { // the shortest text that reads back the same: 0.6
    v.text = shortest_text(node.as_floating_point()->get());
  } else {
    std::ostringstream out;
    node.visit([&](auto&& x) { out << x; });
    v.text = out.str();
  }
  if (node.is_integer()) {
    v.type = Value::Type::integer;
    v.integer = node.as_integer()->get();
  } else if (node.is_floating_point()) {
    v.type = Value::Type::floating;
    v.floating = node.as_floating_point()->get();
  } else if (node.is_boolean()) {
    v.type = Value::Type::boolean;
    v.boolean = node.as_boolean()->get();
  } else if (const toml::table* t = node.as_table()) {
    v.type = Value::Type::table;
    for (const auto& [key, member] : *t)
      v.members.emplace_back(std::string(key.str()), convert(member));
  }
  return v;
}

} // namespace

Parsed parse(const std::string& text, const std::string& source) {
  Parsed p;
  try {
    const toml::table root = toml::parse(text, source);
    p.root = convert(root);
    p.ok = true;
  } catch (const toml::parse_error& e) {
    p.line = static_cast<int>(e.source().begin.line);
    p.column = static_cast<int>(e.source().begin.column);
    p.error = std::string(e.description());
  }
  return p;
}

} // namespace cubelm::io::toml_doc
