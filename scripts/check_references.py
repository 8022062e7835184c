#!/usr/bin/env python3
"""Checks that the repository stands alone: no file cites notes that live outside it.

  check_references.py [--root DIR]

The project was started from design notes, a style guide and reference write-ups of slime and
SGLang kept next to the repository; a maintainer does not have them. What the code relies on is
in docs/ (docs/algorithms.md, docs/http-api.md, docs/architecture.md, ...), and comments point
there. This check fails on any text file that cites the outside notes again: a path into the
shared directory beside the checkout, their file names, or their section numbers ("inventory
§3.1", "SGLang §3.5"). Cluster paths such as /shared/run are fine.

Exit 0 with one summary line, or 1 with one `path:line: ...` line per citation.
"""
import argparse
import os
import re
import sys

CITATIONS = re.compile('|'.join([
    r'\.\./shared\b', r'/work/shared\b',                 # the directory beside the checkout
    r'slime[- ]inventory', r'\binventory\s*§',            # the slime reference write-up
    r'sglang-api\b',                                      # the SGLang API write-up
    r'GPU-MACHINE', r'\bDESIGN\.md', r'\bSTYLE\.md', r'style-anchors',
    r'\b(?:SGLang|slime)\s+§\s*\d',                       # their section numbers
]))
SKIP_DIRS = {'.git', 'node_modules', '__pycache__'}
MAX_BYTES = 4 << 20


def text_files(root):
  """Every text file of the tree, outside .git, build trees and linked directories."""
  for dirpath, dirnames, filenames in os.walk(root):
    dirnames[:] = sorted(
        d for d in dirnames
        if d not in SKIP_DIRS and not d.startswith('build')
        and not os.path.islink(os.path.join(dirpath, d))
        and not os.path.exists(os.path.join(dirpath, d, 'CMakeCache.txt')))
    for name in sorted(filenames):
      path = os.path.join(dirpath, name)
      if os.path.islink(path) or os.path.getsize(path) > MAX_BYTES:
        continue
      with open(path, 'rb') as f:
        data = f.read()
      if b'\0' in data[:8192]:
        continue
      yield path, data.decode('utf-8', errors='replace')


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  here = os.path.abspath(__file__)
  parser.add_argument('--root', default=os.path.dirname(os.path.dirname(here)))
  args = parser.parse_args()
  errors, checked = [], 0
  for path, text in text_files(args.root):
    if os.path.abspath(path) == here:
      continue  # the patterns above
    checked += 1
    for number, line in enumerate(text.split('\n'), 1):
      match = CITATIONS.search(line)
      if match:
        errors.append(f'{os.path.relpath(path, args.root)}:{number}: cites "{match.group(0)}", '
                      'notes outside the repository; say it in docs/ and point there')
  for error in errors:
    print(error)
  if errors:
    print(f'references: {len(errors)} citation(s) of notes outside the repository')
    return 1
  print(f'references ok: {checked} text files cite nothing outside the repository')
  return 0


if __name__ == '__main__':
  sys.exit(main())
