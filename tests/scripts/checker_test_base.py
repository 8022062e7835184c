"""The harness the tests of the scripts/check_*.py checkers share.

Each test writes a small tree into a fresh temporary directory (FILES, plus what the test
adds), runs the checker on it with `--root` as a subprocess, and looks at its exit code and
output. A test module sets the class attributes below and adds its cases.
"""
import os
import subprocess
import sys
import tempfile
import unittest

REPO = os.environ.get('SLIME_SOURCE_DIR') or os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def checker_path(name):
  """scripts/<name> of the repository under test."""
  return os.path.join(REPO, 'scripts', name)


class CheckerTestCase(unittest.TestCase):
  CHECKER = None  # the checker script (checker_path(...))
  FILES = {}  # relative path -> text, written before every test
  ARGS = ()  # arguments after --root ROOT on every run

  def setUp(self):
    self._tmp = tempfile.TemporaryDirectory(prefix=type(self).__name__ + '_')
    self.root = self._tmp.name
    for path, text in self.FILES.items():
      self.write(path, text)

  def tearDown(self):
    self._tmp.cleanup()

  def write(self, path, text, append=False):
    """Writes (or appends) text, or bytes, to root/path."""
    path = os.path.join(self.root, path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    mode = ('a' if append else 'w') + ('b' if isinstance(text, bytes) else '')
    with open(path, mode, encoding=None if 'b' in mode else 'utf-8') as f:
      f.write(text)

  def check(self, *extra):
    """(exit code, stdout + stderr) of the checker on the tree."""
    run = subprocess.run([sys.executable, self.CHECKER, '--root', self.root, *self.ARGS, *extra],
                         capture_output=True, text=True, check=False)
    return run.returncode, run.stdout + run.stderr

  def assert_fails_with(self, *needles, extra=()):
    """The checker exits 1 and its output names every needle; returns the output."""
    rc, out = self.check(*extra)
    self.assertEqual(rc, 1, out)
    for needle in needles:
      self.assertIn(needle, out)
    return out
