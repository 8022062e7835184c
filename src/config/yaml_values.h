// Private to the config module: conversion between YAML nodes and FieldValues.
//
// ParseFieldValue is strict: an int field takes only integer literals, a float field numbers
// (including YAML's .inf), a bool field true/false/yes/no/on/off, a list field a sequence (or a
// single scalar, read as a one-element list). Errors name `where`, the offending value and the
// expected type. Range and enum checks are separate (CheckFieldValue in fields.h).
// Thread-safety: pure functions.
#ifndef SLIME_CONFIG_YAML_VALUES_H_
#define SLIME_CONFIG_YAML_VALUES_H_

#include <yaml-cpp/yaml.h>

#include <string>

#include "slime/common/status.h"
#include "slime/config/fields.h"

namespace slime::config::internal {

// Shortest text that reads back as the same double, always with a '.', an exponent or a YAML
// infinity (".inf"), so it is recognizably a float.
std::string FormatDouble(double v);

// A short description of a node for messages: "'abc'", "a list", "a mapping", "null".
std::string DescribeNode(const YAML::Node& node);

StatusOr<FieldValue> ParseFieldValue(const FieldInfo& field, const YAML::Node& node,
                                     const std::string& where);

// Writes `value` at the emitter's current position. Strings are double-quoted and "${" is
// written as "$${" so that loading the text back does not expand it.
void EmitFieldValue(YAML::Emitter& out, const FieldValue& value);

// "did you mean" for an unknown `section.key` (same section first, then the same key in another
// section, then the closest full path); "" when nothing is close.
std::string SuggestKey(const std::string& section, const std::string& key);

// The error for a key that is not in the table.
Status UnknownKeyError(const std::string& section, const std::string& key);

// The error for a top-level name that is not a section.
Status UnknownSectionError(const std::string& name);

}  // namespace slime::config::internal

#endif  // SLIME_CONFIG_YAML_VALUES_H_
