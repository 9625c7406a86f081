"""Tests of tensorpipe/worker_agreement.py with an in-memory exchange."""

import types
import unittest

from tensorpipe import params_format
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


def _Flags(**changed):
  """absl's FLAGS as StepFlagValues reads them: FLAGS[name].value."""
  values = dict(seed=1234, deterministic=True, mode='train_and_eval',
                eval_steps=None, recompute_bn_stats=0, model='x.Exp',
                logdir='/l')
  values.update(changed)
  return {k: types.SimpleNamespace(value=v) for k, v in values.items()}


class WorkerAgreementTest(unittest.TestCase):

  def testTheComparedFlagsArePinned(self):
    """Every flag that changes the steps a run makes: a flag dropped from
    the list (or added) must be a decision, not an accident."""
    self.assertEqual(agree.STEP_FLAGS, ('--seed', '--deterministic',
                                        '--mode', '--eval_steps',
                                        '--recompute_bn_stats'))
    self.assertEqual(agree.StepFlagValues(_Flags()), {
        '--seed': '1234', '--deterministic': 'True',
        '--mode': 'train_and_eval', '--eval_steps': 'None',
        '--recompute_bn_stats': '0'})

  def testAnotherWorkersSeedStopsEveryWorker(self):
    """What tools/trainer compares (its Params and StepFlagValues(FLAGS)),
    through a fake exchange: worker 1 started with another --seed."""
    for changed, key in ((dict(seed=1), '--seed'),
                         (dict(mode='train'), '--mode'),
                         (dict(deterministic=False), '--deterministic')):
      mine = agree.StepFlagValues(_Flags())
      theirs = agree.StepFlagValues(_Flags(**changed))
      with self.assertRaisesRegex(
          ValueError, rf'^the 2 workers were started with different '
          rf'settings: {key} \(here: {mine[key]}\) differ between workers'):
        agree.CheckAgreement(
            0, 2, agree.KeyDigests(_PARAMS, mine),
            _Exchange([_Text(_PARAMS, theirs)]),
            dict(params_format.TextValues(_PARAMS), **mine))
    # Flags that do not change the steps are not compared.
    agree.CheckAgreement(
        0, 2, agree.KeyDigests(_PARAMS, agree.StepFlagValues(_Flags())),
        _Exchange([_Text(_PARAMS, agree.StepFlagValues(
            _Flags(logdir='/other')))]))

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
          dict(params_format.TextValues(_PARAMS), **flags))

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
