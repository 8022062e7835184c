#!/usr/bin/env python3
"""Checks that the source tree keeps the layering of cmake/layering.txt (docs/architecture.md).

  check_layering.py [--root DIR] [--rules FILE] [--libraries BUILD/slime_libraries.txt]
                    [--docs docs/architecture.md]

Rules (the file's header says the format): every `#include "slime/<b>/..."` in src/<a>/ or
include/slime/<a>/ needs b == a or b on a's line; every directory of src/ and include/slime/ is a
module; torch-free code includes no LibTorch header, neither directly nor through our headers
(torch-free: every file of a module without a (torch) library, and, given --libraries, the
sources of every torch-free library); public headers never include <torch/torch.h>; with --docs,
the rule list of docs/architecture.md ("### Layering") says what the rules file says.

Exit 0 with one summary line when the tree keeps them; exit 1 with one line per violation,
`path:line: ...` naming the file, its module and the module it may not use.
"""
import argparse
import os
import re
import sys

SOURCE_SUFFIXES = ('.h', '.hpp', '.cc', '.cpp', '.cu', '.cuh', '.inc', '.h.in')
INCLUDE_RE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')
TORCH_RE = re.compile(r'^(torch|ATen|c10|caffe2)/')
RULE_RE = re.compile(r'^([a-z0-9_]+):\s*([^|]*)\|(.*)$')
ALLOW_RE = re.compile(r'^allow\s+([a-z0-9_]+)\s*->\s*([a-z0-9_]+)$')
LIB_RE = re.compile(r'^([a-z0-9_]+)(\(torch\))?$')
GENERATED_MODULES = {'v1': 'proto'}  # slime/v1/*.pb.h, generated from proto/slime/v1/


class Rules:
  """cmake/layering.txt: modules in order, their libraries, and what each may use."""

  def __init__(self, path, shown_as=None):
    self.file = path
    self.path = shown_as or path  # in messages
    self.modules = []     # in file order
    self.uses = {}        # module -> set of modules it may use (allowances included)
    self.declared = {}    # module -> the modules its own line names (no allowances)
    self.torch = {}       # library -> built with LibTorch
    self.module_of = {}   # library -> module
    self.errors = []
    self._parse()

  def torch_free_module(self, module):
    return not any(self.torch[lib] for lib, m in self.module_of.items() if m == module)

  def _error(self, number, text):
    self.errors.append(f'{self.path}:{number}: {text}')

  def _parse(self):
    allows = []
    with open(self.file, encoding='utf-8') as f:
      for number, line in enumerate(f, 1):
        line = line.split('#', 1)[0].strip()
        if not line:
          continue
        allow, rule = ALLOW_RE.match(line), RULE_RE.match(line)
        if allow:
          allows.append((number, allow.group(1), allow.group(2)))
        elif rule:
          self._add_module(number, rule.group(1), rule.group(2).split(), rule.group(3).split())
        else:
          self._error(number, f"not a rule: '{line}' (expected '<module>: <libraries> | "
                      "<modules>' or 'allow <a> -> <b>')")
    for number, module, used in allows:
      if module not in self.uses or used not in self.uses:
        self._error(number, f"'allow {module} -> {used}' names a module with no line")
      else:
        self.uses[module].add(used)

  def _add_module(self, number, module, libraries, uses):
    if module in self.uses:
      self._error(number, f"module '{module}' has a second line")
      return
    for used in uses:
      if used not in self.uses:
        self._error(number, f"module '{module}' may use '{used}', which has no line above "
                    "it (dependencies point down the list)")
    for lib in libraries:
      match = LIB_RE.match(lib)
      if not match:
        self._error(number, f"'{lib}' is not a library name (name or name(torch))")
      elif match.group(1) in self.module_of:
        self._error(number, f"library '{match.group(1)}' is in two modules")
      else:
        self.module_of[match.group(1)] = module
        self.torch[match.group(1)] = bool(match.group(2))
    self.modules.append(module)
    self.uses[module] = set(uses)
    self.declared[module] = set(uses)


class Tree:
  """The files of src/ and include/slime/ and their #include lines."""

  def __init__(self, root):
    self.root = root
    self._includes = {}

  def rel(self, path):
    return os.path.relpath(path, self.root)

  def module_dirs(self):
    """(top directory, module name) for every directory of src/ and include/slime/."""
    for top in ('src', os.path.join('include', 'slime')):
      base = os.path.join(self.root, top)
      if os.path.isdir(base):
        for name in sorted(os.listdir(base)):
          if os.path.isdir(os.path.join(base, name)):
            yield os.path.join(base, name), name

  @staticmethod
  def files_under(directory):
    for dirpath, dirnames, filenames in os.walk(directory):
      dirnames.sort()
      for name in sorted(filenames):
        if name.endswith(SOURCE_SUFFIXES):
          yield os.path.join(dirpath, name)

  def includes(self, path):
    """[(line number, '<' or '"', included path)] of one file, cached."""
    if path not in self._includes:
      found = []
      with open(path, encoding='utf-8', errors='replace') as f:
        for number, line in enumerate(f, 1):
          match = INCLUDE_RE.match(line)
          if match:
            found.append((number, match.group(1), match.group(2)))
      self._includes[path] = found
    return self._includes[path]

  def resolve(self, including, kind, included):
    """The file an include names in this tree, or None (system and generated headers)."""
    candidates = [os.path.join(self.root, 'include', included)]
    if kind == '"':
      candidates.insert(0, os.path.join(os.path.dirname(including), included))
    for candidate in candidates:
      if os.path.isfile(candidate):
        return os.path.normpath(candidate)
    return None


class Checker:
  def __init__(self, tree, rules):
    self.tree, self.rules = tree, rules
    self.errors = list(rules.errors)
    self._torch_chain = {}
    self.counts = {'files': 0, 'includes': 0, 'torch_free': 0}

  def run(self, libraries):
    files_by_module = {}
    for directory, module in self.tree.module_dirs():
      if module not in self.rules.uses:
        self.errors.append(f'{self.tree.rel(directory)}: directory of no module in '
                           f'{self.rules.path}: add a line for \'{module}\'')
        continue
      files_by_module.setdefault(module, []).extend(self.tree.files_under(directory))
    torch_free = set()
    for module, files in files_by_module.items():
      for path in files:
        self.check_slime_includes(path, module)
        if self.rules.torch_free_module(module):
          torch_free.add(path)
    for library, sources in libraries.items():
      if library in self.rules.torch and not self.rules.torch[library]:
        torch_free.update(os.path.join(self.tree.root, s) for s in sources)
    for path in sorted(torch_free):
      self.check_torch_free(path)
    self.check_public_headers()
    self.counts['torch_free'] = len(torch_free)
    return self.errors

  def module_of_include(self, included):
    parts = included.split('/')
    if len(parts) < 3 or parts[0] != 'slime':
      return None
    return GENERATED_MODULES.get(parts[1], parts[1])

  def check_slime_includes(self, path, module):
    self.counts['files'] += 1
    allowed = self.rules.uses[module]
    for number, _, included in self.tree.includes(path):
      used = self.module_of_include(included)
      if used is None:
        continue
      self.counts['includes'] += 1
      where = f'{self.tree.rel(path)}:{number}'
      if used not in self.rules.uses:
        self.errors.append(f'{where}: includes "{included}" of \'{used}\', which is no module '
                           f'of {self.rules.path}')
      elif used != module and used not in allowed:
        self.errors.append(
            f'{where}: module \'{module}\' may not include module \'{used}\' ("{included}"); '
            f'\'{module}\' may use: {" ".join(sorted(allowed)) or "nothing"} '
            f'({self.rules.path})')

  def torch_chain(self, path, visiting=()):
    """The include chain from `path` to a LibTorch header, or None."""
    if path in self._torch_chain:
      return self._torch_chain[path]
    chain = None
    for number, kind, included in self.tree.includes(path):
      if TORCH_RE.match(included):
        chain = [(number, included)]
        break
      target = self.tree.resolve(path, kind, included)
      if target and target not in visiting:
        sub = self.torch_chain(target, visiting + (path,))
        if sub:
          chain = [(number, included)] + sub
          break
    self._torch_chain[path] = chain
    return chain

  def check_torch_free(self, path):
    chain = self.torch_chain(path)
    if chain:
      module = self.module_of_path(path)
      via = ' -> '.join(included for _, included in chain)
      self.errors.append(f'{self.tree.rel(path)}:{chain[0][0]}: torch-free code of module '
                         f'\'{module}\' includes LibTorch: {via} (LibTorch only in the '
                         f'(torch) libraries of {self.rules.path})')

  def module_of_path(self, path):
    parts = self.tree.rel(path).split(os.sep)
    return parts[2] if parts[0] == 'include' else parts[1]

  def check_public_headers(self):
    for path in self.tree.files_under(os.path.join(self.tree.root, 'include')):
      for number, _, included in self.tree.includes(path):
        if included == 'torch/torch.h':
          self.errors.append(f'{self.tree.rel(path)}:{number}: a public header includes '
                             '<torch/torch.h>; include <torch/types.h> (the .cc files carry '
                             'the rest)')


def check_docs(file, rules, path):
  """The rule list of docs/architecture.md (the ```text block after its "### Layering" heading,
  `<module>: <modules>` lines, `-` for none) must say what cmake/layering.txt says."""
  with open(file, encoding='utf-8') as f:
    lines = f.read().split('\n')
  try:
    start = lines.index('### Layering')
    start = lines.index('```text', start) + 1
    end = lines.index('```', start)
  except ValueError:
    return [f'{path}: no "### Layering" section with a ```text block of the rules']
  errors, listed = [], {}
  for number, line in enumerate(lines[start:end], start + 1):
    if not line.strip():
      continue
    module, _, uses = line.partition(':')
    listed[module.strip()] = (number, {u for u in uses.split() if u != '-'})
  for module in rules.modules:
    if module not in listed:
      errors.append(f"{path}: the layering block has no line for module '{module}'")
    elif listed[module][1] != rules.declared[module]:
      errors.append(f"{path}:{listed[module][0]}: module '{module}' may use "
                    f"{' '.join(sorted(rules.declared[module])) or '-'} in {rules.path}, "
                    f"not {' '.join(sorted(listed[module][1])) or '-'}")
  for module in listed.keys() - set(rules.modules):
    errors.append(f"{path}:{listed[module][0]}: module '{module}' is not in {rules.path}")
  return errors


def read_libraries(path):
  """slime_libraries.txt (written by the configure step): `<library>: <source> ...` lines."""
  libraries = {}
  with open(path, encoding='utf-8') as f:
    for line in f:
      if ':' in line:
        name, sources = line.split(':', 1)
        libraries[name.strip()] = sources.split()
  return libraries


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  here = os.path.dirname(os.path.abspath(__file__))
  parser.add_argument('--root', default=os.path.dirname(here), help='the source tree')
  parser.add_argument('--rules', help='default: <root>/cmake/layering.txt')
  parser.add_argument('--libraries', help="the configure step's slime_libraries.txt")
  parser.add_argument('--docs', help='also check the rule list of this docs/architecture.md')
  args = parser.parse_args()
  rules_path = args.rules or os.path.join(args.root, 'cmake', 'layering.txt')
  shown_as = os.path.relpath(rules_path, args.root)
  if shown_as.startswith('..'):
    shown_as = rules_path
  checker = Checker(Tree(args.root), Rules(rules_path, shown_as))
  errors = checker.run(read_libraries(args.libraries) if args.libraries else {})
  if args.docs:
    errors += check_docs(args.docs, checker.rules, os.path.relpath(args.docs, args.root))
  for error in errors:
    print(error)
  counts = checker.counts
  if errors:
    print(f'layering: {len(errors)} violation(s) of {shown_as}')
    return 1
  print(f"layering ok: {counts['files']} files, {counts['includes']} includes of slime "
        f"headers, {counts['torch_free']} torch-free files")
  return 0


if __name__ == '__main__':
  sys.exit(main())
