#!/usr/bin/env python3
"""The config-field check fails when a field is not read (ctest: config_fields_checker_test).

scripts/check_config_fields.py runs on small trees written here: a field table and the modules
that read it. A field marked ReadBy(module) whose member that module never reads (or only
mentions in a comment or a string, or only assigns, or reads in another module), a field with
no mark, and a ReadBy naming no module must each fail naming the field; the PENDING list
excuses an unread field and is reported once the field is read.
Arguments: none; SLIME_SOURCE_DIR (set by ctest) or this file's checkout is the repository.
"""
import importlib.util
import unittest

from checker_test_base import CheckerTestCase, checker_path

CHECKER = checker_path('check_config_fields.py')

FIELDS = '''\
#include "field_builder.h"
namespace slime::config::internal {
void AddTrainFields(std::vector<FieldSpec<Config>>* table) {
  SectionBuilder<TrainConfig> b(table, "train", &Config::train);
  b.Add("lr", &TrainConfig::lr)
      .ReadBy("train")
      .Min(0)
      .Doc("Peak learning rate; a ; in a string and ReadBy(\\"job\\") do not confuse the parser.");
  b.Add("seed", &TrainConfig::seed).ReadBy("train", "data").Doc("Seed.");
  b.Add("mtp_num_layers", &TrainConfig::mtp_num_layers).Refused("later work").Doc("MTP.");
}
void AddEvalDatasetFields(std::vector<FieldSpec<EvalDatasetConfig>>* table) {
  EvalDatasetBuilder b(table);
  b.Add("path", &EvalDatasetConfig::path).ReadBy("job").Required().Doc("File.");
}
}  // namespace slime::config::internal
'''

FILES = {
    'src/config/fields_train.cc': FIELDS,
    'src/config/resolve.cc': 'void R(Config& c) { if (c.train.min_lr > 0) {} }\n',
    'src/train/optimizer.cc': ('// Reads the learning rate.\n'
                               'double Lr(const config::TrainConfig& t) { return t.lr * 2; }\n'),
    'include/slime/train/trainer.h': ('inline int Seed(const Options& o) {\n'
                                      '  return o.config.train.seed;\n}\n'),
    'src/data/source.cc': 'int S(const config::Config& config) { return config.train.seed; }\n',
    'src/job/driver.cc': ('void Load(const config::Config& config) {\n'
                          '  for (const config::EvalDatasetConfig& entry :\n'
                          '       config.eval.datasets) {\n'
                          '    Open(entry.path);\n  }\n}\n'),
}


def load_checker():
  spec = importlib.util.spec_from_file_location('check_config_fields', CHECKER)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


class ConfigFieldsCheckerTest(CheckerTestCase):
  CHECKER = CHECKER
  FILES = FILES
  ARGS = ('--no-pending',)

  def add_field(self, statement):
    text = FIELDS.replace('  b.Add("mtp_num_layers"', statement + '\n  b.Add("mtp_num_layers"')
    self.write('src/config/fields_train.cc', text)

  def test_the_fixture_passes(self):
    rc, out = self.check()
    self.assertEqual(rc, 0, out)
    self.assertIn('config fields ok: 3 read, 1 refused', out)

  def test_an_unread_field_fails_naming_it(self):
    self.add_field('  b.Add("warmup", &TrainConfig::lr_warmup_iters).ReadBy("train").Doc("W.");')
    self.assert_fails_with('src/config/fields_train.cc:10: train.warmup', 'ReadBy("train")',
                           'TrainConfig::lr_warmup_iters is not read under src/train/')

  def test_a_mention_in_a_comment_or_a_string_is_no_read(self):
    self.add_field('  b.Add("warmup", &TrainConfig::lr_warmup_iters).ReadBy("train").Doc("W.");')
    self.write('src/train/optimizer.cc',
               '// t.lr_warmup_iters is read elsewhere\n'
               'const char* kHelp = "config.train.lr_warmup_iters";\n'
               'const char* kRaw = R"(config.train.lr_warmup_iters)";\n', append=True)
    self.assert_fails_with('train.warmup', 'TrainConfig::lr_warmup_iters is not read')

  def test_an_assignment_is_no_read(self):
    self.add_field('  b.Add("warmup", &TrainConfig::lr_warmup_iters).ReadBy("train").Doc("W.");')
    self.write('src/train/optimizer.cc',
               'void Set(config::TrainConfig& t) { t.lr_warmup_iters = 3; }\n', append=True)
    self.assert_fails_with('train.warmup', 'TrainConfig::lr_warmup_iters is not read')

  def test_a_member_of_another_section_is_no_read(self):
    self.add_field('  b.Add("warmup", &TrainConfig::lr_warmup_iters).ReadBy("train").Doc("W.");')
    self.write('src/train/optimizer.cc',
               'int W(const config::Config& c) { return c.rollout.lr_warmup_iters; }\n',
               append=True)
    self.assert_fails_with('train.warmup', 'TrainConfig::lr_warmup_iters is not read')

  def test_a_read_in_another_module_is_named(self):
    self.add_field('  b.Add("warmup", &TrainConfig::lr_warmup_iters).ReadBy("train").Doc("W.");')
    self.write('src/job/driver.cc',
               'int W(const config::Config& c) { return c.train.lr_warmup_iters; }\n', append=True)
    self.assert_fails_with('train.warmup', '(it is read in: job)')

  def test_a_read_through_an_auto_reference_counts(self):
    self.add_field('  b.Add("warmup", &TrainConfig::lr_warmup_iters).ReadBy("train").Doc("W.");')
    self.write('src/train/optimizer.cc',
               'int W(const config::Config& c) {\n  const auto& t = c.train;\n'
               '  return t.lr_warmup_iters;\n}\n', append=True)
    rc, out = self.check()
    self.assertEqual(rc, 0, out)

  def test_config_means_resolve_derives_from_it(self):
    self.add_field('  b.Add("min_lr", &TrainConfig::min_lr).ReadBy("config").Doc("M.");')
    rc, out = self.check()
    self.assertEqual(rc, 0, out)
    self.write('src/config/resolve.cc', 'void R(Config& c) {}\n')
    self.assert_fails_with('train.min_lr', 'not read under src/config/')

  def test_one_of_two_modules_not_reading_fails(self):
    self.write('src/data/source.cc', 'int S() { return 0; }\n')
    self.assert_fails_with('train.seed', 'ReadBy("data")', 'not read under src/data/')

  def test_a_dataset_field_needs_a_read_of_an_entry(self):
    self.write('src/job/driver.cc', 'void Load(const config::Config& c) { Open(c.path); }\n')
    self.assert_fails_with('eval.datasets[].path', 'EvalDatasetConfig::path is not read')

  def test_a_field_without_a_mark_fails(self):
    self.add_field('  b.Add("warmup", &TrainConfig::lr_warmup_iters).Min(0).Doc("W.");')
    self.assert_fails_with('train.warmup: marked neither ReadBy(...) nor Refused(...)')

  def test_a_field_with_both_marks_fails(self):
    self.add_field('  b.Add("warmup", &TrainConfig::lr_warmup_iters).ReadBy("train")'
                   '.Refused("x").Doc("W.");')
    self.assert_fails_with('train.warmup: marked both')

  def test_read_by_an_unknown_module_fails(self):
    self.add_field('  b.Add("warmup", &TrainConfig::lr_warmup_iters).ReadBy("trainer").Doc("W.");')
    self.assert_fails_with("train.warmup: ReadBy names 'trainer', which is no module")

  def test_pending_excuses_an_unread_field_until_it_is_read(self):
    checker = load_checker()
    self.add_field('  b.Add("warmup", &TrainConfig::lr_warmup_iters).ReadBy("train").Doc("W.");')
    problems, _, counts = checker.check(self.root, {'train.warmup': 'a branch'})
    self.assertEqual(problems, [])
    self.assertEqual(counts['pending'], 1)
    self.write('src/train/optimizer.cc',
               'int W(const config::TrainConfig& t) { return t.lr_warmup_iters; }\n', append=True)
    problems, _, _ = checker.check(self.root, {'train.warmup': 'a branch'})
    self.assertEqual(len(problems), 1, problems)
    self.assertIn('listed in PENDING (a branch) but read now', problems[0])

  def test_pending_names_must_be_fields(self):
    problems, _, _ = load_checker().check(self.root, {'train.no_such_key': 'a branch'})
    self.assertEqual(len(problems), 1, problems)
    self.assertIn('PENDING names train.no_such_key, which is no field', problems[0])


if __name__ == '__main__':
  unittest.main()
