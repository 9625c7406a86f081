"""End-to-end run of the tools/benchmark binary on the tiny model (slow)."""

import json
import os
import tempfile
import unittest

from tests.tools import tool_testlib


class BenchmarkBinaryTest(unittest.TestCase):

  def testTinyRunWritesTableJsonPlotsAndTimeline(self):
    with tempfile.TemporaryDirectory(
        dir=os.environ.get('TEST_TMPDIR')) as out:
      proc = tool_testlib.RunTool(
          'benchmark', '--models=tiny',
          '--settings=plain,naive-2,K1-T2-rc,K2-T2-rc', '--steps=2',
          '--warmup=1', '--memory_settings=', '--timeline=K2-T2-rc',
          f'--out={out}', timeout_s=900)
      self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
      self.assertIn('| tiny | K2-T2-rc | 2 | 2 | yes |', proc.stdout)
      self.assertIn('| bubble |', proc.stdout)
      with open(os.path.join(out, 'results.json')) as f:
        report = json.load(f)
      self.assertEqual([r['setting'] for r in report['results']],
                       ['plain', 'naive-2', 'K1-T2-rc', 'K2-T2-rc'])
      for path in report['plots']:
        self.assertTrue(os.path.exists(path), path)
      tl = report['timelines'][0]['timeline']
      self.assertEqual(tl['num_events'], 3 * 2 * 2)
      with open(tl['chrome_trace']) as f:
        self.assertIn('traceEvents', json.load(f))
      self.assertTrue(os.path.exists(tl['png']))
      with open(os.path.join(out, 'tables.md')) as f:
        tables = f.read()
      self.assertIn('| tiny | K2-T2-rc | 2 | 2 | yes |', tables)
      self.assertIn('| bubble |', tables)
      os.remove(os.path.join(out, 'tables.md'))
      again = tool_testlib.RunTool(
          'benchmark', f'--report_from={os.path.join(out, "results.json")}',
          timeout_s=300)
      self.assertEqual(again.returncode, 0, again.stderr[-3000:])
      with open(os.path.join(out, 'tables.md')) as f:
        self.assertEqual(f.read(), tables)
      bad = tool_testlib.RunTool(
          'benchmark', f'--report_from={os.path.join(out, "tables.md")}',
          timeout_s=300)
      self.assertNotEqual(bad.returncode, 0)
      self.assertIn('is not a results.json', bad.stderr)
      self.assertNotIn('Traceback', bad.stderr)


if __name__ == '__main__':
  unittest.main()
