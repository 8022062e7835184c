#!/usr/bin/env python3
"""The layering checks fail when a rule is broken (ctest: layering_checker_test).

scripts/check_layering.py runs on small trees written here (one forbidden include, a torch
include in torch-free code, a bad rules file) and must fail naming both modules; the configure
check (cmake/SlimeLayering.cmake, in CMake script mode) must stop on a forbidden DEPS entry.
Arguments: none; SLIME_SOURCE_DIR (set by ctest) or this file's checkout is the repository,
CMAKE_COMMAND the cmake to run (default: cmake on PATH).
"""
import os
import subprocess
import tempfile
import textwrap
import unittest

from checker_test_base import REPO, CheckerTestCase, checker_path

CHECKER = checker_path('check_layering.py')
CMAKE = os.environ.get('CMAKE_COMMAND', 'cmake')

RULES = """\
common:  common                | # no uses
model:   model(torch)          | common
engine:  engine_core engine(torch) | common model
rollout: rollout               | common
job:     job                   | common rollout engine
"""

FILES = {
    'include/slime/common/status.h': '#include <string>\n',
    'include/slime/model/decoder.h': '#include <torch/types.h>\n#include "slime/common/status.h"\n',
    'include/slime/engine/page_pool.h': '#include "slime/common/status.h"\n',
    'include/slime/engine/runner.h': '#include "slime/model/decoder.h"\n',
    'src/engine/page_pool.cc': '#include "slime/engine/page_pool.h"\n',
    'src/engine/runner.cc': '#include "slime/engine/runner.h"\n#include <torch/torch.h>\n',
    'include/slime/rollout/coordinator.h': '#include "slime/common/status.h"\n',
    'src/rollout/coordinator.cc': '#include "slime/rollout/coordinator.h"\n\n#include <vector>\n',
    'include/slime/job/driver.h': ('#include "slime/engine/page_pool.h"\n'
                                   '#include "slime/rollout/coordinator.h"\n'),
    'src/job/driver.cc': '#include "slime/job/driver.h"\n#include "local.h"\n',
    'src/job/local.h': '// a private header\n',
}


class LayeringCheckerTest(CheckerTestCase):
  CHECKER = CHECKER
  FILES = dict(FILES, **{'cmake/layering.txt': RULES})

  def test_the_fixture_keeps_the_rules(self):
    rc, out = self.check()
    self.assertEqual(rc, 0, out)
    self.assertIn('layering ok', out)

  def test_a_forbidden_include_names_the_file_and_both_modules(self):
    self.write('src/rollout/coordinator.cc', '#include "slime/engine/page_pool.h"\n', append=True)
    self.assert_fails_with(
        'src/rollout/coordinator.cc:4: module \'rollout\' may not include module \'engine\' '
        '("slime/engine/page_pool.h")', "'rollout' may use: common")

  def test_a_forbidden_include_in_a_public_header(self):
    self.write('include/slime/engine/page_pool.h', '#include <slime/job/driver.h>\n', append=True)
    self.assert_fails_with("include/slime/engine/page_pool.h:2: module 'engine' may not include "
                           "module 'job'")

  def test_an_allow_line_admits_the_edge(self):
    self.write('src/rollout/coordinator.cc', '#include "slime/engine/page_pool.h"\n', append=True)
    self.write('cmake/layering.txt', 'allow rollout -> engine  # until it moves\n', append=True)
    rc, out = self.check()
    self.assertEqual(rc, 0, out)

  def test_edges_are_direct_not_transitive(self):
    # job may use engine, engine may use model; job may still not include model itself.
    self.write('src/job/driver.cc', '#include "slime/model/decoder.h"\n', append=True)
    self.assert_fails_with("module 'job' may not include module 'model'")

  def test_torch_through_our_headers_fails_torch_free_code(self):
    self.write('include/slime/job/driver.h', '#include "slime/engine/runner.h"\n', append=True)
    self.assert_fails_with(
        "include/slime/job/driver.h:3: torch-free code of module 'job' includes LibTorch: "
        'slime/engine/runner.h -> slime/model/decoder.h -> torch/types.h')

  def test_torch_in_a_private_header_of_torch_free_code(self):
    self.write('src/job/local.h', '#include <ATen/ATen.h>\n', append=True)
    self.assert_fails_with("src/job/driver.cc:2: torch-free code of module 'job' includes "
                           'LibTorch: local.h -> ATen/ATen.h')

  def test_torch_free_library_of_a_torch_module_needs_the_library_list(self):
    self.write('src/engine/page_pool.cc', '#include <c10/util/Half.h>\n', append=True)
    rc, out = self.check()
    self.assertEqual(rc, 0, out)  # engine is a torch module: only the library list tells
    self.write('libraries.txt', 'engine_core: src/engine/page_pool.cc\n'
               'engine: src/engine/runner.cc\n')
    self.assert_fails_with("src/engine/page_pool.cc:2: torch-free code of module 'engine'",
                           extra=('--libraries', os.path.join(self.root, 'libraries.txt')))

  def test_public_headers_never_include_torch_torch_h(self):
    self.write('include/slime/model/decoder.h', '#include <torch/torch.h>\n', append=True)
    self.assert_fails_with('include/slime/model/decoder.h:3: a public header includes '
                           '<torch/torch.h>')

  def test_a_directory_without_a_module_line(self):
    self.write('src/extra/x.cc', '\n')
    self.assert_fails_with("src/extra: directory of no module in cmake/layering.txt")

  def test_rules_may_only_point_up_the_list(self):
    self.write('cmake/layering.txt', RULES.replace('common:  common                |',
                                                   'common:  common                | job'))
    self.assert_fails_with("cmake/layering.txt:1: module 'common' may use 'job', which has no "
                           'line above it')

  def write_docs(self, block):
    self.write('docs/architecture.md', '# Architecture\n\n### Layering\n\nRules:\n\n```text\n'
               + block + '```\n')
    return ('--docs', os.path.join(self.root, 'docs', 'architecture.md'))

  def test_the_docs_list_matches_the_rules(self):
    docs = self.write_docs('common: -\nmodel: common\nengine: common model\nrollout: common\n'
                           'job: engine common rollout\n')
    rc, out = self.check(*docs)
    self.assertEqual(rc, 0, out)

  def test_a_docs_list_that_differs_from_the_rules(self):
    docs = self.write_docs('common: -\nmodel: common\nengine: common model\n'
                           'rollout: common engine\n')
    self.assert_fails_with(
        "docs/architecture.md:11: module 'rollout' may use common in cmake/layering.txt, not "
        'common engine', "docs/architecture.md: the layering block has no line for module 'job'",
        extra=docs)

  def test_a_malformed_rule_line(self):
    self.write('cmake/layering.txt', 'allow rollout engine\n', append=True)
    self.assert_fails_with("cmake/layering.txt:6: not a rule: 'allow rollout engine'")


class ConfigureCheckTest(unittest.TestCase):
  """slime_check_layering() of cmake/SlimeLayering.cmake on the repository's own rules."""

  def configure(self, call):
    with tempfile.TemporaryDirectory(prefix='layering_cmake_') as tmp:
      script = os.path.join(tmp, 'check.cmake')
      with open(script, 'w', encoding='utf-8') as f:
        f.write(textwrap.dedent(f"""\
            cmake_minimum_required(VERSION 3.25)
            include({os.path.join(REPO, 'cmake', 'SlimeLayering.cmake')})
            {call}
            message(STATUS "configure check passed")
            """))
      run = subprocess.run([CMAKE, '-P', script], capture_output=True, text=True, check=False)
    return run.returncode, run.stdout + run.stderr

  def test_allowed_deps_pass(self):
    rc, out = self.configure('slime_check_layering(data OFF "slime::common;slime::tokenizer;'
                             'fmt::fmt")')
    self.assertEqual(rc, 0, out)
    self.assertIn('configure check passed', out)

  def test_a_forbidden_dep_stops_the_configure_step_naming_both_modules(self):
    rc, out = self.configure('slime_check_layering(data OFF "slime::common;slime::trainer")')
    self.assertNotEqual(rc, 0, out)
    self.assertIn("module 'data' may not use module 'train'", ' '.join(out.split()))
    self.assertIn('slime_data links slime::trainer', ' '.join(out.split()))

  def test_job_may_not_link_the_trainer_library(self):
    rc, out = self.configure('slime_check_layering(job OFF "slime::engine")')
    self.assertNotEqual(rc, 0, out)
    self.assertIn("module 'job' may not use module 'engine'", ' '.join(out.split()))

  def test_the_torch_flag_must_match_the_rules(self):
    rc, out = self.configure('slime_check_layering(engine_core ON "slime::common")')
    self.assertNotEqual(rc, 0, out)
    self.assertIn('declares it torch-free', ' '.join(out.split()))

  def test_an_undeclared_library_stops_the_configure_step(self):
    rc, out = self.configure('slime_check_layering(extra OFF "slime::common")')
    self.assertNotEqual(rc, 0, out)
    self.assertIn('library slime_extra belongs to no module', ' '.join(out.split()))


if __name__ == '__main__':
  unittest.main()
