#!/usr/bin/env python3
"""scripts/check_references.py fails when a file cites notes outside the repository again
(ctest: docs_references_checker_test). It runs on small trees written here. The citations are
assembled from pieces so this file does not cite anything itself.
"""
import unittest

from checker_test_base import CheckerTestCase, checker_path

CHECKER = checker_path('check_references.py')

SHARED = '..' + '/shared'
INVENTORY = 'slime' + '-inventory.md'


class ReferencesCheckerTest(CheckerTestCase):
  CHECKER = CHECKER
  FILES = {
      'include/slime/train/losses.h': '// The losses (docs/algorithms.md, "Policy loss").\n',
      'docs/operations.md': 'slime_train status --run-dir /shared/run\n',
  }

  def assert_cited(self, path, text, needle):
    self.write(path, text)
    rc, out = self.check()
    self.assertEqual(rc, 1, out)
    self.assertIn(f'{path}:2: cites "{needle}"', out)

  def test_a_clean_tree_and_cluster_paths_pass(self):
    rc, out = self.check()
    self.assertEqual(rc, 0, out)
    self.assertIn('references ok: 2 text files', out)

  def test_a_path_into_the_shared_directory(self):
    self.assert_cited('include/slime/rollout/coordinator.h',
                      f'// Coordinator\n// ({SHARED}/reference/{INVENTORY} §4.3)\n', SHARED)

  def test_the_reference_file_names(self):
    self.assert_cited('docs/http-api.md', '# API\nas ' + 'sglang' + '-api.md §3.3 says\n',
                      'sglang' + '-api')
    self.assert_cited('src/app/main.cc', '// x\n// one binary (' + 'DESIGN' + '.md §3)\n',
                      'DESIGN' + '.md')
    self.assert_cited('src/common/a.h', '// x\n// (' + 'STYLE' + '.md habit 2)\n',
                      'STYLE' + '.md')

  def test_section_numbers_of_the_outside_notes(self):
    self.assert_cited('src/config/resolve.cc', '// x\n// cross-checks (' + 'inventory' + ' §2.17)\n',
                      'inventory' + ' §')
    self.assert_cited('include/slime/engine/protocol.h',
                      '// x\n// (' + 'SGLang' + ' §3.5: a user abort)\n', 'SGLang' + ' §3')

  def test_build_trees_and_binary_files_are_skipped(self):
    self.write('build/CMakeCache.txt', '')
    self.write('build/notes.txt', f'{SHARED}/x\n')
    self.write('tests/data/blob.bin', b'\0\1' + f'{SHARED}/x'.encode())
    rc, out = self.check()
    self.assertEqual(rc, 0, out)


if __name__ == '__main__':
  unittest.main()
