"""Tests of tensorpipe/worker_agreement.py with an in-memory exchange."""

import unittest

from tensorpipe import worker_agreement as agree

_PARAMS = 'task.train.max_steps : 10\ntask.train.learning_rate : 0.1\n'


def _Exchange(texts_of_others):
  def Exchange(worker_index, text):
    out = list(texts_of_others)
    out.insert(worker_index, text)
    return out
  return Exchange


def _Text(params, flags):
  import json  # pylint: disable=g-import-not-at-top
  return json.dumps(agree.KeyDigests(params, flags))


class WorkerAgreementTest(unittest.TestCase):

  def testSameSettingsPass(self):
    flags = {'--seed': '1', '--mode': 'train'}
    agree.CheckAgreement(0, 2, agree.KeyDigests(_PARAMS, flags),
                         _Exchange([_Text(_PARAMS, flags)]))

  def testDifferentKeysAreNamedWithThisWorkersValues(self):
    flags = {'--seed': '1'}
    other = _PARAMS.replace('max_steps : 10', 'max_steps : 12')
    with self.assertRaisesRegex(
        ValueError, r'^the 2 workers were started with different settings: '
        r'--seed \(here: 1\), task.train.max_steps \(here: 10\) differ '
        r'between workers \(this is worker 1\)'):
      agree.CheckAgreement(
          1, 2, agree.KeyDigests(_PARAMS, flags),
          _Exchange([_Text(other, {'--seed': '2'})]),
          dict(agree.ParamsValues(_PARAMS), **flags))

  def testAKeyOnlyOneWorkerHasDiffers(self):
    every = [agree.KeyDigests(_PARAMS, {}),
             agree.KeyDigests(_PARAMS + 'task.extra : 1\n', {})]
    self.assertEqual(agree.DifferingKeys(every), ['task.extra'])

  def testOneDigestPerKey(self):
    digests = agree.KeyDigests(_PARAMS, {'--seed': '1'})
    self.assertEqual(sorted(digests), ['--seed', 'task.train.learning_rate',
                                       'task.train.max_steps'])
    self.assertNotEqual(digests['task.train.max_steps'],
                        agree.KeyDigests(_PARAMS.replace('10', '11'), {})[
                            'task.train.max_steps'])


if __name__ == '__main__':
  unittest.main()
