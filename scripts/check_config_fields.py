#!/usr/bin/env python3
"""Checks that every config field marked ReadBy(...) is read by the modules it names.

  check_config_fields.py [--root DIR] [--list] [--no-pending]

The field tables (src/config/fields*.cc) register each key with `b.Add("key", &Type::member)`
and mark it `.ReadBy("module", ...)` (the modules whose code uses it; "config" = only
ResolveConfig, which derives other keys from it) or `.Refused("why")` (the config check
rejects any value but the default). For each ReadBy module this script looks in src/<module>/
and include/slime/<module>/ (for "config": src/config/ without the field tables) for a read of
the member, written either through its section (`config.train.lr`, `c_.eval.datasets[i].path`)
or through a variable of the section's type declared in the same file (`const TrainConfig& t`
... `t.lr`; `auto& e = config.eval` ... `e.top_p`). A plain assignment (`t.lr = ...`) is not a
read. A field with neither mark, or both, is an error too (config_test checks the same in C++).

PENDING lists fields whose readers are on branches not merged yet; they may be unread here.
Empty it once those branches are in: a pending field that is read is reported, so the list
cannot go stale unnoticed.

Exit 0 with one summary line when every claim holds; exit 1 with one line per broken claim,
`path:line: section.key: ...`. --list prints each field with its mark and where it is read;
--no-pending checks with an empty PENDING (the checker's own tests use it on small trees).
"""
import argparse
import glob
import os
import re
import sys

# Fields read by code on branches not merged yet (field path -> branch); empty on main.
PENDING = {}

SOURCE_SUFFIXES = ('.h', '.cc', '.cu', '.cuh', '.inc')
SECTION_BUILDER_RE = re.compile(r'SectionBuilder<(\w+)>\s+\w+\(\s*table,\s*"(\w+)"')
DATASET_BUILDER_RE = re.compile(r'EvalDatasetBuilder\s+\w+\(')
ADD_RE = re.compile(r'\bb\.Add\(\s*"(\w+)",\s*&(\w+)::(\w+)\s*\)')
READ_BY_RE = re.compile(r'\.ReadBy\(([^)]*)\)')
REFUSED_RE = re.compile(r'\.Refused\(')
DATASETS = 'datasets'  # the member of EvalConfig holding the dataset entries


class Field:

  def __init__(self, file, line, section, key, struct, member, statement):
    self.file, self.line = file, line
    self.section, self.key, self.struct, self.member = section, key, struct, member
    readers = READ_BY_RE.findall(statement)
    self.read_by = re.findall(r'"(\w+)"', readers[0]) if readers else None
    self.refused = bool(REFUSED_RE.search(statement))

  @property
  def path(self):
    return f'{self.section}.{self.key}' if self.section != 'eval.datasets[]' else (
        f'eval.datasets[].{self.key}')


def statements(text):
  """(offset, text) of each `;`-terminated statement, skipping string literals and comments."""
  out, start, depth, i = [], 0, 0, 0
  while i < len(text):
    c = text[i]
    if c == '"':
      i += 1
      while text[i] != '"':
        i += 2 if text[i] == '\\' else 1
    elif text.startswith('//', i):
      i = text.find('\n', i)
      continue
    elif c in '([':
      depth += 1
    elif c in ')]':
      depth -= 1
    elif c in ';{}' and depth == 0:
      out.append((start, text[start:i]))
      start = i + 1
    i += 1
  return out


def parse_fields(root):
  fields = []
  for file in sorted(glob.glob(os.path.join(root, 'src', 'config', 'fields*.cc'))):
    with open(file, encoding='utf-8') as f:
      text = f.read()
    rel = os.path.relpath(file, root)
    section = struct = None
    for offset, statement in statements(text):
      builder = SECTION_BUILDER_RE.search(statement)
      if builder:
        struct, section = builder.group(1), builder.group(2)
        continue
      if DATASET_BUILDER_RE.search(statement):
        struct, section = 'EvalDatasetConfig', 'eval.datasets[]'
        continue
      add = ADD_RE.search(statement)
      if add:
        line = text.count('\n', 0, offset + add.start()) + 1
        fields.append(Field(rel, line, section, add.group(1), add.group(2), add.group(3),
                            statement))
  return fields


def module_files(root, module):
  """{relative path: text} of a module's code; for config, without the field tables."""
  out = {}
  for top in (os.path.join(root, 'src', module), os.path.join(root, 'include', 'slime', module)):
    for dirpath, _, names in os.walk(top):
      for name in names:
        if not name.endswith(SOURCE_SUFFIXES):
          continue
        path = os.path.join(dirpath, name)
        rel = os.path.relpath(path, root)
        if module == 'config' and (name.startswith('fields') or name == 'field_builder.h'):
          continue
        with open(path, encoding='utf-8', errors='replace') as f:
          out[rel] = strip_comments(f.read())
  return out


def strip_comments(text):
  """`text` with comments removed and string and character literals emptied (raw ones too)."""
  out, i, n = [], 0, len(text)
  while i < n:
    raw = text[i] == 'R' and re.match(r'R"([^(\s]*)\(', text[i:i + 20])
    if raw and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == '_')):
      end = text.find(')' + raw.group(1) + '"', i)
      end = n if end < 0 else end + len(raw.group(1)) + 2
      out.append('""')
      i = end
    elif text[i] == '"' or (text[i] == "'" and not (i and text[i - 1].isalnum())):
      quote, j = text[i], i + 1
      while j < n and text[j] != quote and text[j] != '\n':
        j += 2 if text[j] == '\\' else 1
      out.append(quote * 2)
      i = j + 1
    elif text.startswith('//', i):
      end = text.find('\n', i)
      i = n if end < 0 else end
    elif text.startswith('/*', i):
      end = text.find('*/', i + 2)
      out.append(' ')
      i = n if end < 0 else end + 2
    else:
      out.append(text[i])
      i += 1
  return ''.join(out)


def reads(field, text):
  """True when `text` reads the field's member (see the module docstring)."""
  if field.section == 'eval.datasets[]':
    owners = [rf'\.{DATASETS}\[[^\]]*\]', rf'\.{DATASETS}\.(?:front|back|at)\([^)]*\)']
    section_name = None
  else:
    owners, section_name = [rf'\.{field.section}'], field.section
  # Variables of the section's type: `TrainConfig& t`, `const config::TrainConfig* t`,
  # `for (const config::EvalDatasetConfig& ds : ...)`, `auto& t = config.train`.
  for decl in re.finditer(rf'\b{field.struct}\s*[&*]?\s*(\w+)\b', text):
    owners.append(rf'(?<![\w.]){decl.group(1)}')
  if section_name:
    for decl in re.finditer(rf'\bauto\s*[&*]?\s*(\w+)\s*=\s*[\w.>\-]*\.{section_name}\s*;', text):
      owners.append(rf'(?<![\w.]){decl.group(1)}')
  else:
    for decl in re.finditer(rf'\bauto\s*[&*]?\s*(\w+)\s*=\s*[\w.>\-]*\.{DATASETS}\[', text):
      owners.append(rf'(?<![\w.]){decl.group(1)}')
  access = rf'(?:{"|".join(owners)})\s*(?:\.|->)\s*{field.member}\b'
  for hit in re.finditer(access, text):
    rest = text[hit.end():hit.end() + 3]
    if re.match(r'\s*=(?!=)', rest):  # a plain assignment writes, it does not read
      continue
    return True
  return False


def check(root, pending_fields):
  fields = parse_fields(root)
  problems, listing = [], []
  files = {}
  counts = {'read': 0, 'refused': 0, 'pending': 0}
  if not fields:
    return [f'{root}: no fields found in src/config/fields*.cc'], listing, counts
  known = {f.path for f in fields}
  for path in sorted(set(pending_fields) - known):
    problems.append(f'scripts/check_config_fields.py: PENDING names {path}, which is no field')
  for field in fields:
    where = f'{field.file}:{field.line}: {field.path}'
    if field.read_by is None and not field.refused:
      problems.append(f'{where}: marked neither ReadBy(...) nor Refused(...); every field is '
                      'read by some module or refused')
      continue
    if field.read_by is not None and field.refused:
      problems.append(f'{where}: marked both ReadBy(...) and Refused(...); choose one')
      continue
    if field.refused:
      counts['refused'] += 1
      listing.append(f'{field.path}: refused')
      continue
    if not field.read_by:
      problems.append(f'{where}: ReadBy() names no module')
      continue
    found = {}
    for module in field.read_by:
      if not os.path.isdir(os.path.join(root, 'src', module)):
        problems.append(f"{where}: ReadBy names '{module}', which is no module (no src/{module})")
        continue
      if module not in files:
        files[module] = module_files(root, module)
      found[module] = sorted(rel for rel, text in files[module].items() if reads(field, text))
    listing.append(f'{field.path}: read by ' + '; '.join(
        f'{m} ({", ".join(found[m]) or "nowhere"})' for m in found))
    missing = [m for m in found if not found[m]]
    pending = pending_fields.get(field.path)
    if pending and not missing:
      problems.append(f'{where}: listed in PENDING ({pending}) but read now; remove it from '
                      'PENDING in scripts/check_config_fields.py')
    elif pending:
      counts['pending'] += 1
    elif missing:
      elsewhere = []
      for module in sorted(os.listdir(os.path.join(root, 'src'))):
        if module in found or not os.path.isdir(os.path.join(root, 'src', module)):
          continue
        if module not in files:
          files[module] = module_files(root, module)
        if any(reads(field, text) for text in files[module].values()):
          elsewhere.append(module)
      hint = f' (it is read in: {", ".join(elsewhere)})' if elsewhere else ''
      problems.append(f'{where}: marked ReadBy("{missing[0]}") but {field.struct}::'
                      f'{field.member} is not read under src/{missing[0]}/ or '
                      f'include/slime/{missing[0]}/{hint}; wire it, fix ReadBy, or mark the '
                      'field Refused("why")')
    else:
      counts['read'] += 1
  return problems, listing, counts


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--root', default=os.path.dirname(os.path.dirname(os.path.abspath(
      __file__))), help='repository root (default: this script\'s checkout)')
  parser.add_argument('--list', action='store_true', help='print every field and its readers')
  parser.add_argument('--no-pending', action='store_true', help='check with an empty PENDING')
  args = parser.parse_args()
  pending_fields = {} if args.no_pending else PENDING
  problems, listing, counts = check(args.root, pending_fields)
  if args.list:
    print('\n'.join(listing))
  if problems:
    print('\n'.join(problems))
    print(f'config fields: {len(problems)} problem(s)', file=sys.stderr)
    return 1
  owners = ', '.join(sorted(set(pending_fields.values())))
  pending = f", {counts['pending']} pending ({owners})" if counts['pending'] else ''
  print(f"config fields ok: {counts['read']} read, {counts['refused']} refused{pending}")
  return 0


if __name__ == '__main__':
  sys.exit(main())
