#include "toml_document.hpp"

#include <toml++/toml.h>

#include <sstream>

namespace cubelm::io::toml_doc {

namespace {

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
